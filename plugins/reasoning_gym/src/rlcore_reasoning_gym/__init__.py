"""reasoning-gym's procedural tasks for rlcore: a data source and a reward that uses each task's own scorer."""
