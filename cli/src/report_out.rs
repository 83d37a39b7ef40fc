//! Writing a command's reports, serialized straight into a buffered writer: the JSON report
//! to stdout (`-`) or a file, the HTML page to a file. A comparison of many steps makes tens
//! of MB of each (about 1 KB a tensor compared): they are never held whole in memory, nor
//! copied to add a last newline or escape the page's embedded data.

use std::io::{BufWriter, Write};
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

/// Creates `path` and writes it through a buffer with `write`; errors name the file.
fn to_file(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    std::fs::File::create(path)
        .and_then(|file| write(&mut BufWriter::with_capacity(1 << 20, file)))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
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
