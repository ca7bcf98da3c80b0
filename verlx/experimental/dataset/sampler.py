"""veRL's `verl.experimental.dataset.sampler`: the data.sampler base classes (verlx.data.custom_sampler)."""

from verlx.data.custom_sampler import AbstractCurriculumSampler, AbstractSampler

__all__ = ["AbstractCurriculumSampler", "AbstractSampler"]
