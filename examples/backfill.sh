#!/bin/sh
# Backfill walkthrough: a daily job was down from 1 to 7 November.
set -eu
export ONCE_TZ=Europe/Berlin

# 1. What is missing? (exit 2 and one line per missing or failed period)
once check daily-report || true

# 2. What would run, oldest first? Nothing is claimed.
once catchup --job daily-report --every day --lag 1 --since 2026-11-01 --until 2026-11-07 --dry-run

# 3. Run them, each claimed as once run claims it: safe to start on several hosts at once.
once catchup --job daily-report --every day --lag 1 --since 2026-11-01 --until 2026-11-07 --keep-going -- /opt/reports/daily.sh

# 4. One day came out wrong (a late bank file): run it again, on purpose, with a reason.
once rerun --job daily-report --period 2026-11-03 --reason "late bank file" -- /opt/reports/daily.sh

# 5. Its history shows every attempt, the rerun with its reason.
once history daily-report --limit 20
