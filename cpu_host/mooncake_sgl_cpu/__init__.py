"""Opt-in adaptations that let SGLang serve HiCache with mooncake_sgl on a host without an accelerator.

A distribution of its own (``mooncake-sgl-cpu``), never in the ``mooncake-sgl`` wheel. Off unless
``MOONCAKE_SGL_CPU_ADAPTATIONS=1``: installed, it changes nothing in SGLang without the switch.

- ``touch_points`` every change to SGLang, as ``mooncake_sgl.hicache.touch_points`` records.
- ``adaptations``  the switch, the gates, the entry points and the function behind each point.
- ``kvcacheio``    torch versions of the ``direct`` io backend's host<->device copy ops.
- ``attention``    the ``torch_native`` extend step over new tokens only.
- ``disaggregation`` the prefill send path of prefill/decode disaggregation without CUDA.
"""
