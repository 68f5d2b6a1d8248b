"""Datasets: Stanford Sentiment Treebank trees and synthetic trees."""

from cocktailer.data.sst import (
    Tree,
    chain_tree,
    load_sst,
    parse_stree,
    perfect_tree,
    random_tree,
    sst_sample_dir,
)

__all__ = [
    "Tree",
    "parse_stree",
    "load_sst",
    "sst_sample_dir",
    "perfect_tree",
    "chain_tree",
    "random_tree",
]
