"""The SGLang HiCache adapter: the only package of mooncake_sgl that imports sglang.

- ``plugin``  the ``sglang.srt.plugins`` entry point registering the backend name ``mooncake``.
- ``backend`` ``MooncakeSglStorage``, the ``HiCacheStorage`` over our ``TieredStore``.
- ``layout``  host pool and storage config → page views, key namespace, per-rank file names.

Nothing is imported here, so loading the entry point costs no more than ``plugin`` itself.
"""
