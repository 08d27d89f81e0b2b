"""The SGLang HiCache adapter: the only package of mooncake_sgl that imports sglang.

- ``plugin``         the ``sglang.srt.plugins`` entry point registering the backend name ``mooncake``.
- ``backend``        ``MooncakeSglStorage``, the ``HiCacheStorage`` over our ``TieredStore``.
- ``layout``         host pool and storage config → page views, key namespace, per-rank file names
                     and which rank reports a shared directory.
- ``sidecars``       hybrid models (SGLang's v2 API): the objects a page has beside its KV.
- ``fingerprint``    a cheap fingerprint of the checkpoint, so new weights never read old pages.
- ``cpu_compat``     what a live server needs to run HiCache without CUDA (applied by ``plugin``),
                     with ``cpu_kvcacheio`` (torch versions of the host<->device copy ops) and
                     ``cpu_attention`` (the ``torch_native`` extend step for new tokens only).

Nothing is imported here, so loading the entry point costs no more than ``plugin`` itself.
"""
