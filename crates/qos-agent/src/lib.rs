//! # qos-agent
//!
//! The dDiskQoS sidecar as a library: discovers containers, samples their cgroup I/O counters, drives
//! [`qos_core::Engine`] and applies block-I/O weights, verifying every write by reading the cgroup file back.

pub mod cgroup;
