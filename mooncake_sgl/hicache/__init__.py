"""The SGLang HiCache adapter: the only package of mooncake_sgl that imports sglang.

- ``plugin``         the ``sglang.srt.plugins`` entry point registering the backend name ``mooncake``.
- ``backend``        ``MooncakeSglStorage``, the ``HiCacheStorage`` over our ``TieredStore``.
- ``layout``         host pool and storage config → page views, key namespace, per-rank file names
                     and which rank reports a shared directory.
- ``sidecars``       hybrid models (SGLang's v2 API): the objects a page has beside its KV.
- ``fingerprint``    a cheap fingerprint of the checkpoint, so new weights never read old pages.
- ``cpu/``           opt-in adaptations for serving HiCache on a host without CUDA
                     (``MOONCAKE_SGL_CPU_ADAPTATIONS=1``; applied by ``plugin`` when asked for).

Nothing is imported here, so loading the entry point costs no more than ``plugin`` itself.
"""
