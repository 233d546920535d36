"""Analysis: collect -> numbers (tournament, statistics, papers vs reality) -> report sections and figures."""
