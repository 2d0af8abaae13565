//! [`CgroupDirWriter`]: writes a container's cgroup weight file and reads it back.

use qos_core::Weight;

use crate::backend::{AppliedVia, BackendError, ContainerInfo, WeightWriter};
use crate::cgroup::WeightFile;

/// Writes the cgroup weight file (`blkio.bfq.weight`, `blkio.weight`, `io.bfq.weight` or `io.weight`, whichever
/// the cgroup has) and reads it back.
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupDirWriter;

impl CgroupDirWriter {
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

impl WeightWriter for CgroupDirWriter {
    async fn read(&mut self, info: &ContainerInfo) -> Result<Weight, BackendError> {
        Self::read_now(info)
    }

    async fn write(&mut self, info: &ContainerInfo, weight: Weight) -> Result<AppliedVia, BackendError> {
        Self::write_now(info, weight)
    }
}
