//! The wire format of the Talos machine API calls nodekeeper will make on a
//! Talos node (reboots and upgrades go through machined's gRPC API there:
//! no shell, no systemd). Pure: protobuf encoding of the requests and
//! decoding of the answers, gRPC message framing, and the call's status.
//! Field numbers and paths are Talos's published proto definitions
//! (`api/machine/machine.proto`, `lifecycle.proto`; see
//! `../shared/compat/talos.md`). Hand-written rather than generated: three
//! small messages do not pay for a protobuf crate in an 8 MiB binary.
//!
//! The transport (HTTP/2 over machined's unix socket) is `super::talos`.

/// `machine.MachineService/Reboot`.
pub const REBOOT: &str = "/machine.MachineService/Reboot";
/// `machine.ImageService/Pull` (Talos 1.13+; streams progress, then the
/// pulled image's name). LifecycleService/Upgrade installs only an image
/// already in containerd's store.
pub const IMAGE_PULL: &str = "/machine.ImageService/Pull";
/// `machine.LifecycleService/Upgrade` (Talos 1.13+; streams progress).
pub const LIFECYCLE_UPGRADE: &str = "/machine.LifecycleService/Upgrade";
/// `machine.MachineService/Upgrade` (before Talos 1.13; removed in 1.18).
pub const LEGACY_UPGRADE: &str = "/machine.MachineService/Upgrade";
/// The gRPC metadata key machined reads the caller's role from.
pub const ROLE_HEADER: &str = "talos-role";

/// `RebootRequest.Mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootMode {
    Default = 0,
    Powercycle = 1,
    Force = 2,
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(number: u32, value: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(number << 3 | 2), out);
    varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

/// A varint field (wire type 0); proto3 leaves out the default 0.
fn varint_field(number: u32, value: u64, out: &mut Vec<u8>) {
    if value != 0 {
        varint(u64::from(number << 3), out);
        varint(value, out);
    }
}

/// `RebootRequest { Mode mode = 1; }`.
pub fn reboot_request(mode: RebootMode) -> Vec<u8> {
    let mut out = Vec::new();
    varint_field(1, mode as u64, &mut out);
    out
}

/// `common.ContainerdInstance { ContainerDriver driver = 1;
/// ContainerdNamespace namespace = 2; }` as talosctl sends it for installer
/// images: driver `CRI` (1), namespace `NS_SYSTEM` (1). machined refuses the
/// default `NS_UNKNOWN`.
fn containerd_instance(out: &mut Vec<u8>) {
    let mut instance = Vec::new();
    varint_field(1, 1, &mut instance);
    varint_field(2, 1, &mut instance);
    bytes_field(1, &instance, out);
}

/// `ImageServicePullRequest { ContainerdInstance containerd = 1; string
/// image_ref = 3; }`.
pub fn image_pull_request(image: &str) -> Vec<u8> {
    let mut out = Vec::new();
    containerd_instance(&mut out);
    bytes_field(3, image.as_bytes(), &mut out);
    out
}

/// The pulled image's name from one `ImageServicePullResponse` (a oneof of
/// `string name = 1` or `ImageServicePullProgress pull_progress = 2`), if
/// this message is the name.
pub fn pulled_name(message: &[u8]) -> Result<Option<String>, String> {
    for (number, value) in fields(message)? {
        if let (1, Value::Bytes(name)) = (number, value) {
            return Ok(Some(String::from_utf8_lossy(name).into_owned()));
        }
    }
    Ok(None)
}

/// `LifecycleServiceUpgradeRequest { ContainerdInstance containerd = 1;
/// InstallArtifactsSource source = 2; }` with `InstallArtifactsSource {
/// string image_name = 1; }`, in the store the pull used.
pub fn lifecycle_upgrade_request(image: &str) -> Vec<u8> {
    let mut source = Vec::new();
    bytes_field(1, image.as_bytes(), &mut source);
    let mut out = Vec::new();
    containerd_instance(&mut out);
    bytes_field(2, &source, &mut out);
    out
}

/// `UpgradeRequest { string image = 1; bool preserve = 2; bool stage = 3;
/// bool force = 4; RebootMode reboot_mode = 5; }`, preserving data, not
/// staged: machined pulls, installs and reboots by itself (one reboot; a
/// staged one reboots twice).
pub fn legacy_upgrade_request(image: &str) -> Vec<u8> {
    let mut out = Vec::new();
    bytes_field(1, image.as_bytes(), &mut out);
    varint_field(2, 1, &mut out);
    out
}

/// One gRPC message on the wire: uncompressed flag, big-endian length,
/// the protobuf bytes.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The messages of a gRPC body (a stream's several); `Err` for a
/// compressed or truncated one.
pub fn unframe(mut body: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut messages = Vec::new();
    while !body.is_empty() {
        let Some((head, rest)) = body.split_first_chunk::<5>() else {
            return Err("a truncated gRPC message header".into());
        };
        if head[0] != 0 {
            return Err("a compressed gRPC message (none was asked for)".into());
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if rest.len() < len {
            return Err("a truncated gRPC message".into());
        }
        messages.push(&rest[..len]);
        body = &rest[len..];
    }
    Ok(messages)
}

/// One protobuf field's value: a varint, or a length-delimited field's bytes.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The fields of one protobuf message, (number, value) (fixed-width fields
/// are skipped: the messages read here have none).
fn fields(mut m: &[u8]) -> Result<Vec<(u32, Value<'_>)>, String> {
    fn read_varint(m: &mut &[u8]) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = m.split_first().ok_or("a truncated varint")?;
            *m = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err("a varint longer than 10 bytes".into())
    }
    let mut out = Vec::new();
    while !m.is_empty() {
        let key = read_varint(&mut m)?;
        let (number, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            0 => out.push((number, Value::Varint(read_varint(&mut m)?))),
            2 => {
                let len = read_varint(&mut m)? as usize;
                if m.len() < len {
                    return Err("a truncated field".into());
                }
                out.push((number, Value::Bytes(&m[..len])));
                m = &m[len..];
            }
            1 => m = m.get(8..).ok_or("a truncated fixed64")?,
            5 => m = m.get(4..).ok_or("a truncated fixed32")?,
            w => return Err(format!("wire type {w} is not protobuf's")),
        }
    }
    Ok(out)
}

/// One `LifecycleServiceUpgradeResponse { progress = 1 }`, its progress a
/// oneof of `string message = 1` or `int32 exit_code = 2`.
#[derive(Debug, PartialEq)]
pub enum Progress {
    Message(String),
    /// The upgrade's end: non-zero is failure (the call itself succeeds).
    Exit(i32),
}

/// Read one upgrade progress message.
pub fn upgrade_progress(message: &[u8]) -> Result<Option<Progress>, String> {
    for (number, value) in fields(message)? {
        if let (1, Value::Bytes(progress)) = (number, value) {
            for (n, v) in fields(progress)? {
                match (n, v) {
                    (1, Value::Bytes(text)) => {
                        return Ok(Some(Progress::Message(
                            String::from_utf8_lossy(text).into_owned(),
                        )));
                    }
                    // int32 on the wire: a negative one is 10 bytes, two's complement.
                    (2, Value::Varint(code)) => {
                        return Ok(Some(Progress::Exit(code as i64 as i32)));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(None)
}

/// A call's outcome from its `grpc-status` and `grpc-message` (trailers,
/// or headers for a trailers-only answer): `Err` names the code.
pub fn status(code: Option<&str>, message: Option<&str>) -> Result<(), String> {
    let name = |c: u32| match c {
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "ERROR",
    };
    match code.map(str::trim) {
        Some("0") => Ok(()),
        None => Err("no grpc-status in the answer".into()),
        Some(c) => {
            let n: u32 = c.parse().unwrap_or(2);
            let text = message.map(percent_decode).unwrap_or_default();
            Err(format!(
                "{} ({n}){}",
                name(n),
                if text.is_empty() {
                    String::new()
                } else {
                    format!(": {text}")
                }
            ))
        }
    }
}

/// `grpc-message` is percent-encoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| hex(*c)),
                b.get(i + 2).and_then(|c| hex(*c)),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_encode_as_talos_protos_say() {
        // proto3: the default mode is no bytes at all.
        assert_eq!(reboot_request(RebootMode::Default), Vec::<u8>::new());
        assert_eq!(reboot_request(RebootMode::Powercycle), vec![0x08, 0x01]);
        // containerd = 1 {driver CRI, namespace NS_SYSTEM}, then source = 2
        // (0x12) holding image_name = 1 (0x0a).
        let instance = [0x0a, 4, 0x08, 1, 0x10, 1];
        assert_eq!(
            lifecycle_upgrade_request("ghcr.io/x:v1"),
            [&instance[..], &[0x12, 14, 0x0a, 12], b"ghcr.io/x:v1"].concat()
        );
        // image_ref = 3 (0x1a).
        assert_eq!(
            image_pull_request("img"),
            [&instance[..], &[0x1a, 3], b"img"].concat()
        );
        assert_eq!(
            pulled_name(&[&[0x0a, 3][..], b"a@b"].concat()),
            Ok(Some("a@b".into()))
        );
        assert_eq!(pulled_name(&[0x12, 0]), Ok(None));
        assert_eq!(
            legacy_upgrade_request("img"),
            [&[0x0a, 3][..], b"img", &[0x10, 1]].concat()
        );
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_named() {
        let two = [frame(b"ab"), frame(b"")].concat();
        assert_eq!(two[..5], [0, 0, 0, 0, 2]);
        assert_eq!(unframe(&two), Ok(vec![&b"ab"[..], &b""[..]]));
        assert!(unframe(&[0, 0, 0, 0, 9, 1]).is_err_and(|e| e.contains("truncated")));
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err_and(|e| e.contains("compressed")));
    }

    #[test]
    fn upgrade_progress_and_call_status_are_read() {
        // progress = 1 { message = 1 "pulling" }
        let msg = [&[0x0a, 9, 0x0a, 7][..], b"pulling"].concat();
        assert_eq!(
            upgrade_progress(&msg),
            Ok(Some(Progress::Message("pulling".into())))
        );
        // progress = 1 { exit_code = 2: -1 } (int32, 10-byte varint)
        let mut exit = vec![0x10];
        varint(u64::MAX, &mut exit);
        let msg = [&[0x0a, exit.len() as u8][..], &exit].concat();
        assert_eq!(upgrade_progress(&msg), Ok(Some(Progress::Exit(-1))));
        assert_eq!(status(Some("0"), None), Ok(()));
        assert_eq!(
            status(Some("7"), Some("not%20allowed")),
            Err("PERMISSION_DENIED (7): not allowed".into())
        );
        assert!(status(None, None).is_err());
    }
}
