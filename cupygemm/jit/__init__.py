"""Run-time compilation: render kernel source, compile with NVRTC, cache cubins, load modules."""
