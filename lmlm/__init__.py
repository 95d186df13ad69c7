"""lmlm: Limited Memory Language Models.

An LMLM keeps entity facts out of its weights: training text carries lookup calls
``<|db_start|> Entity <|sep|> Relation <|db_retrieve|> Value <|db_end|>``, the loss skips the value
tokens and ``<|db_end|>``, and at inference a knowledge base answers each call.

Start with ``lmlm quickstart`` (see README.md).
"""

__version__ = "0.1.0"
