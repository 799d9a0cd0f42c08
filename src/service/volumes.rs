//! A drained node's VolumeAttachments and the PersistentVolumes behind
//! them, read when a feature's maintenance asks before it says Succeeded
//! (`decide::volumes`).
//!
//! Read, not watched: VolumeAttachments cannot be selected by node, and a
//! node agent watches only what names its node; and not derived from the
//! node's `status.volumesAttached` either, since the attach/detach
//! controller takes a volume out of that list *before* it detaches it
//! (and often before the pod object is gone), which is why Cluster API
//! lists them too. One paged list per look (a waiting maintenance looks
//! every 2 to 20 s), and one get per PersistentVolume still attached to
//! this node.
//! Both are read untyped: only a handful of fields matter, and the typed
//! PersistentVolume's deserializer (every in-tree volume source) would
//! cost the binary more than this whole feature.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::context::Context;
use crate::decide::volumes::{Attached, Volumes};

/// VolumeAttachments per page of the list.
const PAGE: u32 = 250;

/// Every VolumeAttachment of `node` that says it is attached, with its
/// PersistentVolume's claim and CSI name where the volume could be read.
pub async fn read(ctx: &Context, node: &str) -> Volumes {
    let client = ctx.effects.client.clone();
    let vas: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("storage.k8s.io", "VolumeAttachment", "volumeattachments"),
    );
    // Paged, so a cluster with many attachments never sits in memory
    // whole; only this node's attached ones are kept.
    let mut mine = Vec::new();
    let mut params = ListParams {
        limit: Some(PAGE),
        ..Default::default()
    };
    loop {
        let page = match vas.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return Volumes::Unreadable(format!(
                    "this identity may not list VolumeAttachments ({})",
                    crate::error::first_line(&s.message)
                ));
            }
            Err(e) => return Volumes::Failed(format!("listing VolumeAttachments: {e}")),
        };
        mine.extend(page.items.into_iter().filter(|va| on_node(va, node)));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => break,
        }
    }
    let pvs: Api<DynamicObject> = Api::all_with(
        client,
        &resource("", "PersistentVolume", "persistentvolumes"),
    );
    let mut attached = Vec::new();
    for va in &mine {
        let Some(volume) = str_at(&va.data, "/spec/source/persistentVolumeName") else {
            // An inline volume (no PersistentVolume): named by its
            // attachment, waited for as it is.
            attached.push(Attached {
                attachment: va.metadata.name.clone().unwrap_or_default(),
                volume: format!(
                    "(inline, attachment {})",
                    va.metadata.name.as_deref().unwrap_or("")
                ),
                ..Default::default()
            });
            continue;
        };
        let mut a = Attached {
            attachment: va.metadata.name.clone().unwrap_or_default(),
            volume: volume.to_string(),
            ..Default::default()
        };
        match pvs.get_opt(volume).await {
            Ok(Some(pv)) => {
                a.claim = claim_of(&pv.data);
                a.unique = csi_name(&pv.data);
            }
            Ok(None) => {}
            Err(e) => return Volumes::Failed(format!("reading PersistentVolume {volume}: {e}")),
        }
        attached.push(a);
    }
    Volumes::Read(attached)
}

/// `spec.nodeName` is `node` and `status.attached` is true.
fn on_node(va: &DynamicObject, node: &str) -> bool {
    str_at(&va.data, "/spec/nodeName") == Some(node)
        && va.data.pointer("/status/attached").and_then(Value::as_bool) == Some(true)
}

/// `namespace/name` of the claim a PersistentVolume is bound to.
fn claim_of(pv: &Value) -> Option<String> {
    let kind = str_at(pv, "/spec/claimRef/kind").unwrap_or("PersistentVolumeClaim");
    (kind == "PersistentVolumeClaim").then_some(())?;
    Some(format!(
        "{}/{}",
        str_at(pv, "/spec/claimRef/namespace")?,
        str_at(pv, "/spec/claimRef/name")?
    ))
}

/// The name a CSI volume has in `Node.status.volumesAttached`, as the
/// attach/detach controller writes it.
fn csi_name(pv: &Value) -> Option<String> {
    Some(format!(
        "kubernetes.io/csi/{}^{}",
        str_at(pv, "/spec/csi/driver")?,
        str_at(pv, "/spec/csi/volumeHandle")?
    ))
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// A resource's address, for reading it untyped.
fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: if group.is_empty() {
            "v1".into()
        } else {
            format!("{group}/v1")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_claim_and_the_csi_name_the_node_lists() {
        let pv = json!({"spec": {
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "shop", "name": "data"},
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}});
        assert_eq!(claim_of(&pv).as_deref(), Some("shop/data"));
        assert_eq!(
            csi_name(&pv).as_deref(),
            Some("kubernetes.io/csi/ebs.csi.aws.com^vol-1")
        );
        let unbound = json!({"spec": {"hostPath": {"path": "/x"}}});
        assert_eq!(claim_of(&unbound), None);
        assert_eq!(csi_name(&unbound), None);
    }

    #[test]
    fn only_this_nodes_attached_attachments_count() {
        let va = |node: &str, attached: bool| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": "csi-1"},
                "spec": {"nodeName": node, "attacher": "x", "source": {"persistentVolumeName": "pv"}},
                "status": {"attached": attached}}))
            .unwrap()
        };
        assert!(on_node(&va("n1", true), "n1"));
        assert!(!on_node(&va("n1", false), "n1"));
        assert!(!on_node(&va("n2", true), "n1"));
    }
}
