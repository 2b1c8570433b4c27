"""`rmscore hardening`: fault, overload, cancellation, soak and hostile-input scenarios on every kind."""
