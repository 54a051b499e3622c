"""The ground floor, torch-free: errors and exit statuses, atomic writes and digests, file integrity, the numerics
profile, progress lines, and the names of the choices the schema checks and the code acts on."""

FLOOR = 0
