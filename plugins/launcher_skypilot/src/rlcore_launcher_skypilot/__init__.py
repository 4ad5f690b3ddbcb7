"""rlcore's SkyPilot launcher: a manifest as a SkyPilot task (``[launcher] name = "skypilot"``)."""
