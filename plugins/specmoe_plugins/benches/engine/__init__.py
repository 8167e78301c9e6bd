# SPDX-License-Identifier: Apache-2.0
"""``platform bench engine``: a speculative step against its memory roofline (``bench.py``), with the bytes a step
must read (``roofline.py``) and the verification pass taken apart (``breakdown.py``)."""
