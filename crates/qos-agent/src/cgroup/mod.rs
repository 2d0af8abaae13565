//! cgroup v1/v2 access: mount detection, path confinement, counters, weight files (being written).
