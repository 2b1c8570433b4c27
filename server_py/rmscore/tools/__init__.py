"""Starting servers: the one registry of server kinds (`kinds`) and the one launcher (`launch`),
used by `rmscore up`, `rmscore bench`, `rmscore hardening`, the scripts and the tests."""
