"""Data for every task, all seeded and generated or read locally (nothing is downloaded); one file per task."""
