"""Token shards for training at scale: ``lmlm data prepare`` and :class:`ShardBlocks` (see :mod:`lmlm.data.shards`)."""

__all__ = ["prepare_shards", "ShardBlocks", "ShardError", "read_manifest", "is_shards", "tokenizer_hash"]


def __getattr__(name):  # numpy and torch load only when shards are used
    if name in __all__:
        from . import shards

        return getattr(shards, name)
    raise AttributeError(name)
