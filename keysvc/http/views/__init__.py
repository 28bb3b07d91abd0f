"""HTTP views, one module per resource. Views are thin: load, call the store, dump."""
