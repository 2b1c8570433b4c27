"""`rmscore up`: which runtime is fastest here, measured, then the whole local stack (stack.py)."""
