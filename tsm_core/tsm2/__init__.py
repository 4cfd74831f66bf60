"""TSM2R and TSM2L: the tall-and-skinny GEMM kernels and everything that drives them.

- ``tsm2r.cu``, ``tsm2l.cu``: the kernels (TSM2R's V0..V3 ladder stays visible);
- ``configs.py``: kernel rules and the tuning space, as data;
- ``model.py``: the paper's performance model and Algorithm 5 (pure: imports no
  launcher); ``profile.py``: the stored TSM2L profile it may use;
- ``launch.py``: resolve a configuration, allocate, launch;
- ``autotune.py``: everything that times kernels (the autotuner, the profile's
  measurement) and the tuned choices' cache;
- ``api.py``: ``matmul``, ``tsm2r``, ``tsm2l``, ``plan``, ``explain``,
  ``device_spec``: asks the model and the tuner, hands their choice to the launcher.
"""
