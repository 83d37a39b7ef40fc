//! Writing a command's reports, serialized straight into a buffered writer: the JSON report
//! to stdout (`-`) or a file, the HTML page to a file. A comparison of many steps makes tens
//! of MB of each (about 1 KB a tensor compared): they are never held whole in memory, nor
//! copied to add a last newline or escape the page's embedded data.

use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Serialize;
use ttrace_compare::report::CompareReport;

/// Writes `value` as pretty-printed JSON and a newline to `path` (`-`: stdout).
pub fn json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    if path.as_os_str() == "-" {
        let out = std::io::stdout().lock();
        return write_to(BufWriter::new(out), value)
            .map_err(|e| anyhow::anyhow!("writing the JSON report to stdout: {e}"));
    }
    to_file(path, |w| write_to(w, value))
}

/// Writes `report` as a self-contained HTML page to `path`.
pub fn html(path: &Path, report: &CompareReport) -> anyhow::Result<()> {
    to_file(path, |w| {
        ttrace_compare::report::html::write(report, w)?;
        w.flush()
    })
}

/// Writes `path` through a buffer with `write`; errors name the file. A regular file (or a
/// new one) is written beside it under a temporary name and renamed over it once whole: a
/// report that fails half-way (a full disk, a comparison whose spilled results cannot be read
/// back) leaves no truncated file behind, and an earlier report at that path stays as it was.
/// Anything else (`/dev/stdout`, a pipe, a symbolic link) is written in place, as named.
fn to_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let named = |e: std::io::Error| anyhow::anyhow!("{}: {e}", path.display());
    let in_place = std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file());
    let (dir, name) = match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if !in_place => (dir, name),
        _ => {
            return std::fs::File::create(path)
                .and_then(|file| write(&mut BufWriter::with_capacity(1 << 20, file)))
                .map_err(named)
        }
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".{}.tmp", std::process::id()));
    let temp = dir.join(temp_name);
    // A temporary left by a crashed writer of this pid is reused (truncated); a symbolic link
    // planted under its name is refused, not followed.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)
        .and_then(|file| {
            let mut w = BufWriter::with_capacity(1 << 20, file);
            write(&mut w)?;
            w.flush()
        })
        .and_then(|()| std::fs::rename(&temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(named)
}

fn write_to<W: Write>(mut w: W, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut w, value)?;
    w.write_all(b"\n")?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_holds_what_to_string_pretty_gives_and_a_newline() {
        let value = serde_json::json!({"verdict": "match", "tensors": [{"error_eps": 0.5}]});
        let path =
            std::env::temp_dir().join(format!("ttrace-report-out-{}.json", std::process::id()));
        json(&path, &value).expect("write");
        let text = std::fs::read_to_string(&path).expect("read back");
        std::fs::remove_file(&path).ok();
        assert_eq!(
            text,
            serde_json::to_string_pretty(&value).expect("json") + "\n"
        );
    }

    /// A report that fails half-way leaves the earlier report at its path as it was, and no
    /// temporary file; one written whole replaces it.
    #[test]
    fn a_failed_report_leaves_the_earlier_one_whole() {
        let dir = std::env::temp_dir().join(format!("ttrace-report-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("report.json");
        std::fs::write(&path, "earlier\n").expect("earlier report");
        let err = to_file(&path, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("report.json: disk full"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "earlier\n");
        let left: Vec<_> = std::fs::read_dir(&dir).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary file left");
        json(&path, &serde_json::json!({"verdict": "match"})).expect("write");
        assert!(std::fs::read_to_string(&path)
            .expect("read")
            .contains("match"));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// What is not a regular file is written in place (a report to `/dev/null`, a pipe, a
    /// symbolic link), never replaced by a file of its name.
    #[test]
    fn a_device_or_a_link_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt;
        json(Path::new("/dev/null"), &serde_json::json!({})).expect("written to /dev/null");
        let null = std::fs::symlink_metadata("/dev/null").expect("/dev/null");
        assert!(
            null.file_type().is_char_device(),
            "/dev/null is still a device"
        );
        let dir = std::env::temp_dir().join(format!("ttrace-report-link-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (target, link) = (dir.join("target.json"), dir.join("link.json"));
        std::os::unix::fs::symlink(&target, &link).expect("link");
        json(&link, &serde_json::json!({"verdict": "match"})).expect("written through the link");
        let kept = std::fs::symlink_metadata(&link).expect("link");
        assert!(kept.file_type().is_symlink(), "the link is kept");
        assert!(std::fs::read_to_string(&target)
            .expect("target")
            .contains("match"));
        // A temporary left by a crashed writer of this pid does not block the next report.
        let report = dir.join("report.json");
        std::fs::write(
            dir.join(format!(".report.json.{}.tmp", std::process::id())),
            "stale",
        )
        .expect("stale temporary");
        json(&report, &serde_json::json!({"verdict": "match"})).expect("written");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            names.len(),
            3,
            "target, link and report, no temporary: {names:?}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_file_that_cannot_be_made_is_named() {
        let path = Path::new("/nonexistent-ttrace-dir/report.json");
        let err = json(path, &serde_json::json!({})).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("/nonexistent-ttrace-dir/report.json: "),
            "{err}"
        );
    }
}
