"""``python -m lmlm.train``: the ``lmlm train`` command, for torchrun and ``accelerate launch``."""

from .cli import main

main()
