"""rlcore's ``ray`` launcher: training ranks as Ray actors, or the whole run as a Ray job."""
