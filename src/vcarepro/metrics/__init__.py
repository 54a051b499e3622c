"""Measurement: FID and its Inception statistics, the sampling protocol the paper's FIDs follow, the digit
extractor, the linear reference, complexity counts, and the intervals and aggregation across seeds."""

FLOOR = 3
