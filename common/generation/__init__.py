"""The one generation engine: opd's rollouts (the tool world and teacher guidance on top) and the embedded server
(continuous admission on top) both build on it.

- ``decode_batch.py``: ``DecodeBatch``, the rows generated together: batched prefill and decode of one or more
  models in lockstep on a carried KV cache, rows waiting, leaving and joining.
- ``kv_cache.py``: ``GrowingKVLayer``/``decode_cache``, the KV cache that appends in place.
- ``sampler.py``: ``TokenSampler`` (temperature / top-k / top-p / min-p / greedy; one generator, or one per row) and
  the server's ``Penalties``.
"""
