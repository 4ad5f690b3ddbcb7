"""rlcore's SLURM launcher: renders an sbatch script, submits it and follows the job."""
