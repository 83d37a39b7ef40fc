//! Taking possession of a store directory: the one place that decides where a collector may
//! write a store.
//!
//! * The directory is created (mode `0700`) when missing; an existing one is used only when it
//!   is empty, and its mode is never changed (it may be somebody's shared directory).
//! * One writer per store: the collector holds an exclusive `flock` on `STORE/.lock` for as
//!   long as it writes. The emptiness check is repeated *after* the lock is taken, so two
//!   collectors racing for one directory cannot both pass it (the loser finds the winner's
//!   lock held, or its files present once the lock was released).
//! * A small reserve file (`STORE/.reserve`) is allocated up front and freed just before the
//!   final manifest and indexes are written, so that a disk filled by the segments still has
//!   room for the files that say what was lost.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{fallocate, flock, FallocateFlags, FlockOperation, OFlags};
use rustix::io::Errno;
use tracing::debug;

/// Name of the lock file inside a store.
pub const LOCK_FILE: &str = ".lock";
/// Name of the space reserve inside a store.
pub const RESERVE_FILE: &str = ".reserve";
/// Bytes kept in reserve for the final manifest and indexes.
const RESERVE_BYTES: u64 = 2 << 20;

/// Why a directory cannot hold a new store.
#[derive(Debug, thiserror::Error)]
pub enum StoreDirError {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The path exists and is not a directory (or is a symbolic link).
    #[error("{0}: exists and is not a directory; choose a new path for the store")]
    NotADirectory(PathBuf),
    /// The directory already has files in it.
    #[error("{0}: the directory is not empty (it holds {1}); a store goes into a new or empty directory")]
    NotEmpty(PathBuf, String),
    /// Another collector holds the store's lock.
    #[error("{0}: another ttrace collector is writing a store there")]
    Locked(PathBuf),
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> StoreDirError + '_ {
    move |source| StoreDirError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A store directory this process owns for writing (released when dropped).
#[derive(Debug)]
pub struct StoreDir {
    path: PathBuf,
    /// Holds the `flock`; closing it releases the store.
    _lock: File,
    /// The directory was created by [`StoreDir::create`] (not an existing empty one).
    created: bool,
    /// Its device and inode, to notice it removed or replaced during the run.
    id: (u64, u64),
}

impl StoreDir {
    /// Creates `path` (parents too; the store itself `0700`) or takes an existing empty
    /// directory, locks it for this writer and sets the space reserve aside.
    pub fn create(path: &Path) -> Result<StoreDir, StoreDirError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(at(parent))?;
        }
        let created = match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let m = std::fs::symlink_metadata(path).map_err(at(path))?;
                if !m.is_dir() {
                    return Err(StoreDirError::NotADirectory(path.to_path_buf()));
                }
                // Checked before taking the lock too, so a non-empty directory never gets a
                // lock file of ours.
                check_empty(path, false)?;
                false
            }
            Err(e) => return Err(at(path)(e)),
        };
        let lock_path = path.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(OFlags::NOFOLLOW.union(OFlags::CLOEXEC).bits() as i32)
            .open(&lock_path)
            .map_err(at(&lock_path))?;
        // Held as long as the descriptor is open, i.e. while this StoreDir lives; released by
        // the kernel when the writer dies.
        match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => return Err(StoreDirError::Locked(path.to_path_buf())),
            Err(e) => return Err(at(&lock_path)(e.into())),
        }
        // Under the lock: a writer that came and went in between left its files.
        check_empty(path, true)?;
        reserve(path);
        let id = {
            use std::os::unix::fs::MetadataExt;
            let m = lock.metadata().map_err(at(&lock_path))?;
            (m.dev(), m.ino())
        };
        Ok(StoreDir {
            id,
            path: path.to_path_buf(),
            _lock: lock,
            created,
        })
    }

    /// Gives the directory back as it was found, when nothing was stored in it (the
    /// collector could not start, the command never ran): our own files are removed, and
    /// the directory too when we created it and it is then empty. Anything else stays.
    pub fn abandon(self) {
        let _ = std::fs::remove_file(self.path.join(RESERVE_FILE));
        let _ = std::fs::remove_file(self.path.join(LOCK_FILE));
        if self.created {
            let _ = std::fs::remove_dir(&self.path);
        }
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the store is still where it was created (its lock file is still the one this
    /// writer holds: the directory was not removed or replaced).
    pub fn still_there(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(self.path.join(LOCK_FILE))
            .is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// Frees the space reserve (before the last files of the store are written).
    pub fn free_reserve(&self) {
        let _ = std::fs::remove_file(self.path.join(RESERVE_FILE));
    }
}

/// Fails unless `dir` is empty (but for our lock file when `locked`).
fn check_empty(dir: &Path, locked: bool) -> Result<(), StoreDirError> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(at(dir))? {
        let e = e.map_err(at(dir))?;
        let name = e.file_name();
        if locked && name == LOCK_FILE {
            continue;
        }
        names.push(name.to_string_lossy().into_owned());
        if names.len() == 3 {
            break;
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    Err(StoreDirError::NotEmpty(dir.to_path_buf(), names.join(", ")))
}

/// Allocates the reserve; a file system without room goes without.
fn reserve(dir: &Path) {
    let p = dir.join(RESERVE_FILE);
    let made = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)
        .and_then(
            |mut f| match fallocate(&f, FallocateFlags::empty(), 0, RESERVE_BYTES) {
                Ok(()) => Ok(()),
                // As posix_fallocate does where the file system has no fallocate: write the
                // blocks (zeros), so the reserve is there all the same.
                Err(Errno::OPNOTSUPP) => {
                    use std::io::Write;
                    let zeros = [0u8; 64 << 10];
                    (0..RESERVE_BYTES / zeros.len() as u64).try_for_each(|_| f.write_all(&zeros))
                }
                Err(e) => Err(e.into()),
            },
        );
    if let Err(e) = made {
        debug!("{}: no space reserve ({e})", p.display());
        let _ = std::fs::remove_file(&p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ttraced-sd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_directory_is_private_and_locked() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("new");
        let s = StoreDir::create(&d.join("a/b")).expect("creates");
        let mode = std::fs::metadata(s.path())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        match StoreDir::create(s.path()) {
            Err(StoreDirError::NotEmpty(..) | StoreDirError::Locked(_)) => {}
            other => panic!("a second writer got {other:?}"),
        }
        drop(s);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_existing_directory_keeps_its_mode_and_must_be_empty() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("existing");
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let s = StoreDir::create(&d).expect("an empty directory is taken");
        let mode = std::fs::metadata(&d).expect("stat").permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777, "the mode is left alone");
        drop(s);
        std::fs::write(d.join("notes.txt"), "mine").expect("write");
        let _ = std::fs::remove_file(d.join(LOCK_FILE));
        let _ = std::fs::remove_file(d.join(RESERVE_FILE));
        match StoreDir::create(&d) {
            Err(StoreDirError::NotEmpty(_, names)) => assert_eq!(names, "notes.txt"),
            other => panic!("got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The writer's lock is an flock on the store's lock file, held exactly as long as the
    /// StoreDir lives: another writer (another open of the file, as from another process)
    /// cannot take it meanwhile, and can once it is dropped.
    #[test]
    fn the_store_is_flocked_while_its_writer_lives_and_has_its_reserve() {
        use std::os::unix::fs::MetadataExt;
        let d = scratch("flock");
        let s = StoreDir::create(&d).expect("creates");
        let reserve = std::fs::metadata(d.join(RESERVE_FILE)).expect("the reserve exists");
        assert_eq!(reserve.len(), RESERVE_BYTES);
        assert!(
            reserve.blocks() * 512 >= RESERVE_BYTES,
            "the reserve is allocated, not sparse"
        );
        let other = File::open(d.join(LOCK_FILE)).expect("open the lock file");
        assert_eq!(
            flock(&other, FlockOperation::NonBlockingLockExclusive),
            Err(Errno::WOULDBLOCK),
            "a second writer took the lock"
        );
        drop(s);
        flock(&other, FlockOperation::NonBlockingLockExclusive)
            .expect("the lock is released with its writer");
        let _ = std::fs::remove_dir_all(&d);
    }
}
