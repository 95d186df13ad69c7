"""The paper's own numbers, as data: each reproduced claim is shown beside them.

From Zhao et al., *Pre-training Limited Memory Language Models with Internal and External
Knowledge* (arXiv v2): table and figure references are the paper's. Percentages as printed.
"""

from __future__ import annotations

__all__ = ["PAPER"]

PAPER: dict = {
    # Table "Evaluations on factual precision" (FactScore, T-REx EM, PopQA Acc)
    "factual_precision": {
        "LLaMA2-176M": {"standard": (10.1, 46.3, 24.59), "lmlm": (30.6, 54.1, 49.61)},
        "LLaMA2-382M": {"standard": (14.0, 52.0, 22.7), "lmlm": (31.9, 58.1, 50.8)},
        "GPT2-124M": {"standard": (10.7, 41.2, 18.51), "lmlm": (20.6, 54.6, 49.89)},
        "GPT2-355M": {"standard": (14.4, 44.9, 21.4), "lmlm": (23.9, 58.7, 52.0)},
    },
    # Table "Impact of database access" (FactScore, T-REx EM)
    "no_database": {
        "LLaMA2-176M": {"standard": (10.1, 46.3), "lmlm_no_db": (11.3, 34.9), "lmlm": (30.6, 54.1)},
        "LLaMA2-382M": {"standard": (14.0, 52.0), "lmlm_no_db": (12.8, 38.5), "lmlm": (31.9, 58.1)},
    },
    # Table "Fuzzy Match and Prefix-Tree Decoding" (FactScore, w/o length penalty, facts / response)
    "prefix_tree": {
        "LLaMA2-176M": {"standard": (10.1, 11.8, 23.7), "prefix_tree": (23.0, 23.9, 34.6), "fuzzy": (30.6, 32.4, 31.4)},
        "LLaMA2-382M": {"standard": (14.0, 16.6, 32.4), "prefix_tree": (23.5, 31.3, 28.1), "fuzzy": (31.9, 32.7, 33.7)},
    },
    # Table "RAG vs LMLM", GPT2-355M scale (FactScore, T-REx EM, PopQA Acc)
    "rag": {"gpt2_medium": (15.2, 28.4, 19.1), "gpt2_medium_rag": (20.1, 75.8, 37.5), "lmlm": (23.9, 58.7, 52.0)},
    # NLU table, "All" column (normalized accuracy)
    "nlu": {"LLaMA2-176M": {"standard": 36.7, "lmlm": 37.2}, "LLaMA2-382M": {"standard": 37.7, "lmlm": 37.8}},
    # Section 4.1: LMLM lower in all three variants; dynamic perplexity lower by 1.98 on average
    "perplexity": {"dynamic_reduction": 1.98},
    # Section 4.2 / figure "Evaluation of Machine Unlearning": forget 5%, LLaMA-3.2-1B-Instruct
    "tofu": {"forget_quality_threshold": 0.05, "forget_split": "forget05"},
    # Appendix B: loss-difference thresholds per offloading ratio (nats)
    "offloading": {"ratios": (0.0, 0.25, 0.5, 0.75, 0.9, 1.0),
                   "thresholds": {0.1: 3.51, 0.25: 2.24, 0.5: 1.25, 0.75: 0.64, 0.9: 0.13}},
}
