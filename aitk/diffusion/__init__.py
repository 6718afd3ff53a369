"""The diffusion math, model-agnostic: what a training step draws and how it is scored.

    noise.py          the NoiseSchedule protocol, noise sampling, the loss
    flow_matching.py  flow matching: x_t = (1 - s) x + s n, target n - x
    ddpm.py           DDPM: epsilon or v-prediction, min-SNR weighting
    timesteps.py      timestep distributions and shifts (train.timestep_type)
"""
