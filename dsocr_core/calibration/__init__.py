"""Calibration: kernel microbenchmarks (microbench.py), the profile file they produce (profile.py), and profiles
derived for GPUs one does not have (derive.py). The analytic time model (analytic/predict.py) reads profiles."""
from .profile import (FORMAT, FORMAT_VERSION, Profile, ProfileError, Table, add_tables, build_profile,
                      entry_work, load_profile, profile_from_dict, uniform_profile)

__all__ = ["FORMAT", "FORMAT_VERSION", "Profile", "ProfileError", "Table", "add_tables", "build_profile", "entry_work",
           "load_profile", "profile_from_dict", "uniform_profile"]
