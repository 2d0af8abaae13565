//! Backends that work on cgroup files directly: [`CgroupfsCounters`] (one open file per container, one read per
//! round) and [`CgroupfsWriter`] (write the weight file, read it back).

use std::collections::HashMap;

use qos_core::{ContainerId, IoCounters, Weight};
use tracing::debug;

use crate::backend::{AppliedVia, BackendError, ContainerInfo, CounterSource, WeightWriter};
use crate::cgroup::{CounterReader, WeightFile};

/// Counters read from each container's cgroup stat file, kept open between rounds.
#[derive(Debug, Default)]
pub struct CgroupfsCounters {
    readers: HashMap<ContainerId, CounterReader>,
}

impl CgroupfsCounters {
    /// No container attached yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Attaches synchronously (the trait's `attach` is this, wrapped).
    pub fn attach_now(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        let reader = CounterReader::open(dir)?;
        debug!(container = %info.id.short(), file = %reader.source_file().display(), "sampling counters");
        self.readers.insert(info.id.clone(), reader);
        Ok(())
    }

    /// Whether the container is attached.
    pub fn contains(&self, id: &ContainerId) -> bool {
        self.readers.contains_key(id)
    }

    /// Number of attached containers.
    pub fn len(&self) -> usize {
        self.readers.len()
    }

    /// Whether none is attached.
    pub fn is_empty(&self) -> bool {
        self.readers.is_empty()
    }

    /// One round, synchronously.
    pub fn sample_now(&mut self, out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>) {
        out.reserve(self.readers.len());
        for (id, reader) in &mut self.readers {
            out.push((id.clone(), reader.read().map_err(BackendError::from)));
        }
    }
}

impl CounterSource for CgroupfsCounters {
    async fn attach(&mut self, info: &ContainerInfo) -> Result<(), BackendError> {
        self.attach_now(info)
    }

    fn detach(&mut self, id: &ContainerId) {
        self.readers.remove(id);
    }

    async fn sample(&mut self, out: &mut Vec<(ContainerId, Result<IoCounters, BackendError>)>) {
        self.sample_now(out)
    }
}

/// Writes the cgroup weight file (`blkio.bfq.weight`, `blkio.weight`, `io.bfq.weight` or `io.weight`, whichever
/// the cgroup has) and reads it back.
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupfsWriter;

impl CgroupfsWriter {
    /// Reads the current weight synchronously.
    pub fn read_now(info: &ContainerInfo) -> Result<Weight, BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        Ok(WeightFile::open(dir)?.read()?)
    }

    /// Writes and verifies synchronously.
    pub fn write_now(info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        let dir = info.cgroup.as_ref().ok_or_else(|| BackendError::NoCgroup(info.id.clone()))?;
        WeightFile::open(dir)?.write_verified(weight)?;
        Ok(AppliedVia::CgroupFile)
    }
}

impl WeightWriter for CgroupfsWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        Self::read_now(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        Self::write_now(info, weight)
    }
}
