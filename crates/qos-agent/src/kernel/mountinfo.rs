//! The kernel's mount table, `/proc/self/mountinfo` (see proc(5)): its lines parsed, its octal escapes undone.
//! Reading the file is the caller's, so each layer names the file in its own error type and tests feed text.

use super::DevNum;

/// The mount table of the agent's mount namespace.
pub(crate) const MOUNTINFO: &str = "/proc/self/mountinfo";

/// The fields of one mountinfo line that the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountLine<'a> {
    /// Which directory of the file system the mount shows (4th field), unescaped.
    pub(crate) root: String,
    /// Where it is mounted (5th field), unescaped.
    pub(crate) mount_point: String,
    /// The file system type, e.g. `cgroup2`.
    pub(crate) fstype: &'a str,
    /// The per-superblock options, e.g. `rw,blkio`.
    pub(crate) super_options: &'a str,
}

impl<'a> MountLine<'a> {
    /// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`: six fixed fields,
    /// optional fields up to a lone "-", then fstype, source, super options. `None` for a malformed line.
    pub(crate) fn parse(line: &'a str) -> Option<Self> {
        let mut fields = line.split(' ');
        let _id = fields.next()?;
        let _parent = fields.next()?;
        let _dev = fields.next()?;
        let root = fields.next()?;
        let mount_point = fields.next()?;
        let _options = fields.next()?;
        fields.by_ref().find(|f| *f == "-")?;
        let fstype = fields.next()?;
        let _source = fields.next()?;
        let super_options = fields.next()?;
        Some(Self { root: unescape(root), mount_point: unescape(mount_point), fstype, super_options })
    }
}

/// The device number of the file system mounted at `/` (the last mount on `/` wins, as later mounts hide earlier
/// ones), with the mount source.
pub(crate) fn root_device(text: &str) -> Option<(DevNum, String)> {
    let mut found = None;
    for line in text.lines() {
        let mut fields = line.split(' ');
        let (Some(_), Some(_), Some(dev), Some(_), Some(mp)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if mp != "/" {
            continue;
        }
        let Some((maj, min)) = dev.split_once(':') else { continue };
        let (Ok(major), Ok(minor)) = (maj.parse(), min.parse()) else { continue };
        let source = fields.by_ref().skip_while(|f| *f != "-").nth(2).map(unescape).unwrap_or_default();
        found = Some((DevNum { major, minor }, source));
    }
    found
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = bytes[i + 1..i + 4].iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            if let Ok(b) = u8::try_from(v) {
                out.push(b);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime shared:9 - cgroup cgroup rw,blkio
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn lines_with_and_without_optional_fields() {
        let lines: Vec<_> = TABLE.lines().filter_map(MountLine::parse).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            MountLine {
                root: "/".into(),
                mount_point: "/sys/fs/cgroup/blkio".into(),
                fstype: "cgroup",
                super_options: "rw,blkio"
            }
        );
        assert_eq!((lines[2].fstype, lines[2].super_options), ("cgroup2", "rw"));
        for bad in ["", "garbage", "1 2 3", "1 2 3 / / rw no-separator ext4 /dev/x rw"] {
            assert_eq!(MountLine::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn escapes() {
        let line =
            MountLine::parse("38 31 0:35 /docker/a\\040b /sys/my\\040blkio rw - cgroup cgroup rw,blkio").unwrap();
        assert_eq!((line.root.as_str(), line.mount_point.as_str()), ("/docker/a b", "/sys/my blkio"));
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
        assert_eq!(unescape("\\999"), "\\999");
    }

    #[test]
    fn root_device_is_last_mount_on_slash() {
        assert_eq!(root_device(TABLE), Some((DevNum { major: 254, minor: 0 }, "/dev/vda".into())));
        let text = format!("{TABLE}99 27 0:50 / / rw - overlay overlay rw\n");
        assert_eq!(root_device(&text), Some((DevNum { major: 0, minor: 50 }, "overlay".into())));
        assert_eq!(root_device("1 2 x / / rw - ext4 /dev/sda rw\n"), None);
        assert_eq!(root_device("1 2 8:1 / /mnt rw - ext4 /dev/sda rw\n"), None);
    }
}
