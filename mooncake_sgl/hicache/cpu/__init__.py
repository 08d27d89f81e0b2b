"""Opt-in adaptations that let SGLang serve HiCache on a host without an accelerator.

Off unless ``MOONCAKE_SGL_CPU_ADAPTATIONS=1``: installing the wheel registers the storage backend and
changes nothing else in SGLang.

- ``adaptations``  the switch, the gates (no accelerator, checked sglang) and each patch, applied
                   from ``hicache.plugin`` and the ``sglang.srt.platforms`` hook.
- ``kvcacheio``    torch versions of the ``direct`` io backend's host<->device copy ops.
- ``attention``    the ``torch_native`` extend step over new tokens only.
- ``disaggregation`` the prefill send path of prefill/decode disaggregation without CUDA.
"""
