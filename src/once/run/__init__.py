"""The run path: claim, the command under its guard, the heartbeat and the fenced finish."""
