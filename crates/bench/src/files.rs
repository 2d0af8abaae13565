//! Test files: the sizes the plan needs, filled with seeded pseudo-random content, written with large direct
//! writes so creating a 1000 MiB file takes a second or two and leaves nothing in the page cache.
//!
//! Content: a pool of a few 1 MiB random blocks (SplitMix64), each written block being one of them with a unique
//! 64-byte header (seed, file, block), so no two blocks are equal and nothing compresses or deduplicates.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// One MiB.
pub const MIB: u64 = 1 << 20;
/// Alignment for `O_DIRECT` buffers, offsets and lengths.
pub const ALIGN: usize = 4096;
const POOL_BLOCKS: usize = 8;
/// Blocks per write call.
const BLOCKS_PER_WRITE: usize = 4;

/// A file to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Name inside the files directory.
    pub name: String,
    /// Size in MiB.
    pub size_mib: u64,
}

/// SplitMix64: tiny, fast, good enough to make file content incompressible.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fills `buf` (whole 8-byte words; a tail shorter than 8 bytes gets part of one).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A heap buffer of `len` bytes whose start is aligned to [`ALIGN`], without unsafe code: over-allocate and slice.
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed aligned buffer.
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + ALIGN];
        let addr = storage.as_ptr() as usize;
        let offset = (ALIGN - addr % ALIGN) % ALIGN;
        Self { storage, offset, len }
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    /// The aligned bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

/// Writes every file of `specs` into `dir`, content derived from `seed`. Existing files of the right size are kept.
/// `progress` is called with the MiB written so far.
pub fn create_all(dir: &Path, specs: &[FileSpec], seed: u64, mut progress: impl FnMut(u64)) -> Result<Vec<PathBuf>> {
    let mut pool = vec![vec![0u8; MIB as usize]; POOL_BLOCKS];
    let mut rng = SplitMix64::new(seed);
    for block in &mut pool {
        rng.fill(block);
    }
    let mut buf = AlignedBuf::new(BLOCKS_PER_WRITE * MIB as usize);
    let mut done = 0;
    let mut paths = Vec::with_capacity(specs.len());
    for (file_index, spec) in specs.iter().enumerate() {
        let path = dir.join(&spec.name);
        let complete = std::fs::metadata(&path).map(|m| m.len() == spec.size_mib * MIB).unwrap_or(false);
        if !complete {
            write_file(&path, spec.size_mib, seed, file_index as u64, &pool, &mut buf, |n| progress(done + n))?;
        }
        done += spec.size_mib;
        progress(done);
        paths.push(path);
    }
    Ok(paths)
}

fn open_for_writing(path: &Path) -> Result<(File, bool)> {
    let direct = OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(f) => Ok((f, true)),
        // tmpfs and some others refuse O_DIRECT: fall back to buffered writes plus fsync.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let f = OpenOptions::new().write(true).create(true).truncate(true).open(path);
            Ok((f.with_context(|| format!("cannot create {}", path.display()))?, false))
        }
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

fn write_file(
    path: &Path,
    size_mib: u64,
    seed: u64,
    file_index: u64,
    pool: &[Vec<u8>],
    buf: &mut AlignedBuf,
    mut progress: impl FnMut(u64),
) -> Result<()> {
    let (mut f, direct) = open_for_writing(path)?;
    let mut block = 0u64;
    while block < size_mib {
        let n = (size_mib - block).min(BLOCKS_PER_WRITE as u64) as usize;
        for i in 0..n {
            fill_block(
                &mut buf.as_mut_slice()[i * MIB as usize..(i + 1) * MIB as usize],
                pool,
                seed,
                file_index,
                block + i as u64,
            );
        }
        f.write_all(&buf.as_slice()[..n * MIB as usize]).with_context(|| format!("cannot write {}", path.display()))?;
        block += n as u64;
        progress(block);
    }
    f.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
    if !direct {
        drop_cache(&f);
    }
    Ok(())
}

/// Block `block` of file `file_index`: a pool block chosen by the position, with a unique header.
pub fn fill_block(out: &mut [u8], pool: &[Vec<u8>], seed: u64, file_index: u64, block: u64) {
    let mut mix = SplitMix64::new(seed ^ (file_index << 40) ^ block);
    let pick = (mix.next_u64() % pool.len() as u64) as usize;
    out.copy_from_slice(&pool[pick]);
    let header = [seed, file_index, block, mix.next_u64(), mix.next_u64(), mix.next_u64(), mix.next_u64(), 0];
    for (chunk, word) in out[..64].chunks_mut(8).zip(header) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
}

/// Drops a file's pages from the page cache (after `sync_all`, so they are clean).
pub fn drop_cache(f: &File) {
    let _ = nix::fcntl::posix_fadvise(f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [ALIGN, 3 * ALIGN, MIB as usize] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_mut_slice().len(), len);
        }
    }

    #[test]
    fn splitmix_is_seeded_and_deterministic() {
        let (mut a, mut b, mut c) = (SplitMix64::new(7), SplitMix64::new(7), SplitMix64::new(8));
        let va: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va[0], c.next_u64());
        let mut tail = [0u8; 5];
        SplitMix64::new(1).fill(&mut tail);
        assert_ne!(tail, [0; 5]);
    }

    #[test]
    fn creates_files_of_the_right_size_with_distinct_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let specs = vec![FileSpec { name: "a".into(), size_mib: 1 }, FileSpec { name: "b".into(), size_mib: 6 }];
        let mut last = 0;
        let paths = create_all(dir.path(), &specs, 42, |n| last = n).unwrap();
        assert_eq!(last, 7);
        assert_eq!(std::fs::metadata(&paths[0]).unwrap().len(), MIB);
        let b = std::fs::read(&paths[1]).unwrap();
        assert_eq!(b.len() as u64, 6 * MIB);
        let blocks: Vec<&[u8]> = b.chunks(MIB as usize).collect();
        for i in 0..blocks.len() {
            for j in i + 1..blocks.len() {
                assert_ne!(blocks[i], blocks[j], "blocks {i} and {j} are equal");
            }
        }
        // Same seed, same content; an existing complete file is kept as is.
        let again = create_all(dir.path(), &specs, 42, |_| {}).unwrap();
        assert_eq!(std::fs::read(&again[1]).unwrap(), b);
        let other = tempfile::tempdir().unwrap();
        let different = create_all(other.path(), &specs, 43, |_| {}).unwrap();
        assert_ne!(std::fs::read(&different[1]).unwrap(), b);
    }
}
