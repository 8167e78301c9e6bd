#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One short GPU check of what the CPU machines cannot run: the GPU tests (tests/gpu: a target split over
# cuda:0 + cpu, the Triton kernels) and the GPU benchmarks (verifier kernels at paper dimensions, the draft-head
# predictor, a speculative step vs its roofline, the cost-model calibration). Each step has its own time limit
# and writes its output to $OUT (default ./gpu_out); a failing step does not stop the others; ONLY="name ..."
# runs only the named steps.
#
# On a machine without internet, with torch + CUDA installed: put the wheels this needs in .whl/ (a specmoe wheel
# from `pip wheel . --no-deps -w .whl` and the transformers / omegaconf / filelock / accelerate wheels with their missing
# dependencies) and run `bash docker/gpu_check.sh`; with internet `pip install -e ".[triton,accelerate]"` first.
set -u
export PYTHONUNBUFFERED=1  # a step cut at its limit keeps what it printed
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
step() {  # step NAME SECONDS COMMAND...
  local name=$1 secs=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi  # ONLY="gpu_tests bench_engine"
  echo "=== $name (limit ${secs}s)"
  local t0=$SECONDS
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name rc=$rc $((SECONDS - t0))s"
  tail -n 40 "$OUT/$name.log"
}
if [ -d .whl ]; then
  python -m pip install -q --no-index --find-links .whl pyyaml transformers==5.24.0 omegaconf==2.4.0 "filelock>=4.3" accelerate 2>&1 | tail -3
  python -m pip install -q --no-index --no-deps .whl/specmoe-*.whl 2>&1 | tail -3
fi
python - <<'EOF' | tee "$OUT/env.txt"
import platform, torch, transformers
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
try:
    import triton; print("triton", triton.__version__)
except ImportError as e:
    print("no triton", e)
EOF
step gpu_tests 150 python -m pytest -q tests/gpu -p no:cacheprovider
step bench_verifier 100 python -m specmoe.cli.main bench verifier --iters 10 --warmup 2
step bench_predictor 60 python -m specmoe.cli.main bench draft_head --device cuda --no-demo
step bench_engine 100 python -m specmoe.cli.main bench engine --device cuda --dtype bfloat16 --new-tokens 48 --repeats 2 \
  --json "$OUT/bench_engine.json"
python -c "
from specmoe.bench.target import DEMO
from specmoe.models.tiny import build_tiny_model
d = dict(DEMO); arch = d.pop('arch'); seed = d.pop('seed')
build_tiny_model(arch, '/tmp/demo_target', seed=seed, **d)" >"$OUT/build_target.log" 2>&1
step cost_calibration 100 python -m specmoe.cli.main bench goodput_cost --target /tmp/demo_target --device cuda \
  --dtype bfloat16 --iters 3 --warmup 1 --check-steps 20 --save "$OUT/cost_model.json"
# goodput against fixed chains on the demo-size target, priced by the cost model just measured (without one it
# starts from the CPU prior and spends the step's limit exploring)
step bench_goodput 120 python -m specmoe.cli.main bench goodput --target /tmp/demo_target --device cuda \
  --dtype bfloat16 --gammas 2,4,6 --prompts 2 --new-tokens 64 --repeats 1 \
  --goodput "{\"cost_model\": \"$OUT/cost_model.json\"}" --json "$OUT/bench_goodput.json"
