"""The reproduction report: reads only files (params, metrics, logs, samples, the paper's numbers)."""

FLOOR = 5
