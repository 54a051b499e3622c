"""The ground floor, torch-free: errors and exit statuses, atomic writes and digests, file integrity, the numerics
profile, progress lines, the names of the choices the schema checks and the code acts on, the recipes' types, and
stopping child processes (SIGTERM, a grace period, SIGKILL)."""

FLOOR = 0
