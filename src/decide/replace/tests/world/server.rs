//! The replacement worlds' API server and cloud: each effect of a pass
//! applied as they would apply it (resourceVersion guards, server-side
//! apply of statuses, a create-node answered with the same instance for
//! the same request), a write refused now and then, and the invariants
//! checked as an effect lands.

use super::*;

impl World {
    /// Apply `effects` in order; false when one failed (the pass ends).
    pub(super) fn apply(&mut self, effects: &[Effect], governing_nv: &NodeVersion) -> bool {
        for e in effects {
            if matches!(e, Effect::Event { .. }) {
                continue;
            }
            if self.faults && self.rng.chance(4) {
                self.refused += 1;
                self.trace.push(format!("refused: {}", short(e)));
                if let Effect::Provider { key, .. } = e {
                    self.fail(key, "provider: refused".into());
                }
                return false;
            }
            self.trace.push(format!("apply: {}", short(e)));
            if !windows_open(governing_nv, self.now) {
                self.check_closed(e);
            }
            self.check_control_planes_first(e, governing_nv);
            self.check_autoscaler_stopped(e);
            self.check_autoscaler_on(e);
            if !self.apply_one(e, governing_nv) {
                return false;
            }
            self.check_surge();
        }
        true
    }

    /// Outside every window: no new surge request, and a drain begins
    /// only for a donor whose heir joined (what started finishes).
    fn check_closed(&self, e: &Effect) {
        match e {
            Effect::PatchObject { .. } => {
                if let Some((id, _)) = self.new_requests(e).first() {
                    panic!("surge request {id} made outside every window");
                }
            }
            Effect::CreateMaintenance { nm } => {
                let n = &nm.spec.node_name;
                let donor = self
                    .nodes
                    .iter()
                    .any(|h| h.annotations().get(DONOR_ANNOTATION) == Some(n));
                assert!(donor, "the drain of {n} began outside every window");
            }
            _ => {}
        }
    }

    /// Removing `name` from etcd leaves at least as many members as the
    /// world started with: its heir joined first.
    fn check_quorum(&self, name: &str) {
        let members = self
            .nodes
            .iter()
            .filter(|n| n.labels().contains_key(CONTROL_PLANE_LABEL))
            .map(|n| n.name_any())
            .filter(|n| n != name && !self.etcd_removed.contains(n))
            .count();
        assert!(
            members >= self.cp_count,
            "{name} removed from etcd, leaving {members} members of {}",
            self.cp_count
        );
    }

    /// No worker's surge request is recorded while a control plane runs
    /// an image other than the one asked for (control planes first).
    fn check_control_planes_first(&self, e: &Effect, nv: &NodeVersion) {
        let new = self.new_requests(e);
        if new.is_empty() {
            return;
        }
        let want = nv.spec.image.as_deref().unwrap_or_default();
        let behind: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.labels().contains_key(CONTROL_PLANE_LABEL))
            .filter(|n| {
                let pid = n.spec.as_ref().and_then(|s| s.provider_id.clone());
                pid.and_then(|p| self.cloud.get(&p))
                    .is_some_and(|i| i.image != want)
            })
            .map(|n| n.name_any())
            .collect();
        for (id, group) in new {
            assert!(
                behind.is_empty() || group.eq_ignore_ascii_case(CP_GROUP),
                "worker surge request {id} while control planes {behind:?} run another image than {want}"
            );
        }
    }

    /// The autoscaler is turned on only when every NodeVersion is known to
    /// be done: the other one, busy, would turn it off again (a fight).
    fn check_autoscaler_on(&self, e: &Effect) {
        let Effect::PatchObject {
            kind: Kind::AutoscalingStrategy,
            patch,
            ..
        } = e
        else {
            return;
        };
        let other = self.other.unwrap_or_default();
        assert!(
            patch["spec"]["enabled"] != json!(true) || other == Other::Done,
            "the autoscaler turned on while the other NodeVersion is {other:?}"
        );
    }

    /// No new surge request while the autoscaler runs (it would fight
    /// the surge): only once its status says it stopped.
    fn check_autoscaler_stopped(&self, e: &Effect) {
        let running = self
            .strategy
            .as_ref()
            .is_some_and(|st| st.status.as_ref().is_some_and(|x| x.enabled));
        if !running {
            return;
        }
        if let Some((id, _)) = self.new_requests(e).first() {
            panic!("surge request {id} while the autoscaler runs");
        }
    }

    /// The surge requests `e` records that were never recorded before,
    /// with their groups.
    fn new_requests(&self, e: &Effect) -> Vec<(String, String)> {
        let Effect::PatchObject {
            kind: Kind::NodeVersion,
            patch,
            ..
        } = e
        else {
            return Vec::new();
        };
        let mut after = serde_json::to_value(&self.nv).unwrap_or_default();
        merge(&mut after, patch);
        let after: NodeVersion = serde_json::from_value(after).unwrap_or_else(|_| self.nv.clone());
        surge_requests(&after)
            .into_iter()
            .filter(|(id, _)| !self.requests.contains(id))
            .collect()
    }

    fn fail(&mut self, key: &str, message: String) {
        let at = self.now;
        self.failures
            .insert(key.to_string(), Failure { message, at });
    }

    fn apply_one(&mut self, e: &Effect, governing_nv: &NodeVersion) -> bool {
        match e {
            Effect::Provider { key, verb, request } => {
                self.provider(key, verb, request, governing_nv)
            }
            Effect::PatchObject {
                kind, name, patch, ..
            } => self.patch_object(*kind, name, patch),
            Effect::WriteObjectStatus {
                kind,
                name,
                resource_version,
                status,
            } => {
                // Server-side apply by one field manager: the status is
                // replaced, not merged.
                let clear = json!({
                    "metadata": { "resourceVersion": resource_version },
                    "status": null,
                });
                self.patch_object(*kind, name, &clear)
                    && self.patch_object(*kind, name, &json!({ "status": status }))
            }
            Effect::PatchNode {
                node,
                resource_version,
                patch,
            } => self.patch_node(node, resource_version.as_deref(), patch),
            Effect::CreateObject { kind, object } => self.create(*kind, object),
            Effect::DeleteObject { kind, name, uid } => {
                assert_eq!(
                    *kind,
                    Kind::PendingNode,
                    "deletes only PendingNodes: {name}"
                );
                self.pending
                    .retain(|p| !(p.name_any() == *name && (uid.is_none() || p.uid() == *uid)));
                true
            }
            Effect::DeleteNode { name, uid } => self.delete_node(name, uid.as_deref()),
            Effect::CreateMaintenance { nm } => self.create_maintenance(nm),
            Effect::DeleteMaintenance { nm, uid } => {
                self.nms
                    .retain(|m| !(m.name_any() == *nm && m.uid().as_deref() == Some(uid.as_str())));
                self.draining.remove(nm);
                true
            }
            other => panic!("replacement asked for an effect it never makes: {other:?}"),
        }
    }

    fn patch_node(&mut self, node: &str, guard: Option<&str>, patch: &Value) -> bool {
        let rv = self.bump();
        let Some(n) = self.nodes.iter_mut().find(|n| n.name_any() == node) else {
            return false;
        };
        if guard.is_some() && guard != n.metadata.resource_version.as_deref() {
            return false;
        }
        let mut v = serde_json::to_value(&*n).unwrap_or_default();
        merge(&mut v, patch);
        v["metadata"]["resourceVersion"] = json!(rv);
        match serde_json::from_value(v) {
            Ok(x) => *n = x,
            Err(e) => panic!("{node}: a node patch the API server would refuse: {e}"),
        }
        true
    }

    fn provider(&mut self, key: &str, verb: &str, request: &Value, nv: &NodeVersion) -> bool {
        if self.faults && self.rng.chance(5) {
            self.fail(key, format!("provider {verb}: the cloud refused"));
            return false;
        }
        self.failures.remove(key);
        match verb {
            "create-node" => self.create_node(request, nv),
            "delete-node" => {
                let pid = request["providerID"].as_str().unwrap_or_default();
                if let Some(i) = self.cloud.get_mut(pid)
                    && matches!(i.state, State::Creating(_) | State::Ready)
                {
                    i.state = State::Terminating(self.rng.below(3) as u32);
                }
                true
            }
            "set-scaling-group-image" => {
                let group = request["groupId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_lowercase();
                let image = request["image"].as_str().unwrap_or_default().to_string();
                self.group_images.insert(group, image);
                true
            }
            "remove-etcd-member" => {
                let name = request["nodeName"].as_str().unwrap_or_default().to_string();
                // Constellation's etcd client finds the member by this.
                assert_eq!(
                    request["internalIP"].as_str(),
                    Some(ip_of(&name).as_str()),
                    "remove-etcd-member for {name}: {request}"
                );
                self.check_quorum(&name);
                self.etcd_removed.insert(name);
                true
            }
            other => panic!("a provider call the worlds do not model: {other}"),
        }
    }

    /// The same request is the same instance; the answer is recorded as
    /// its PendingNode next, as the service does.
    fn create_node(&mut self, request: &Value, nv: &NodeVersion) -> bool {
        let id = request["requestId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let group = request["groupId"].as_str().unwrap_or_default().to_string();
        let image = self
            .group_images
            .get(&group.to_lowercase())
            .cloned()
            .unwrap_or_default();
        let existing = self
            .cloud
            .iter()
            .find(|(_, i)| i.request.as_deref() == Some(id.as_str()))
            .map(|(pid, i)| (pid.clone(), i.name.clone()));
        let (pid, name) = existing.unwrap_or_else(|| {
            self.serial += 1;
            let name = format!("s{}", self.serial);
            let pid = format!("kwok://{name}");
            let state = State::Creating(1 + self.rng.below(3) as u32);
            let instance = Instance {
                name: name.clone(),
                image,
                state,
                request: Some(id.clone()),
                group: group.to_lowercase(),
            };
            self.cloud.insert(pid.clone(), instance);
            self.created += 1;
            (pid, name)
        });
        self.check_surge();
        let inputs = Inputs::default();
        let snap = inputs.snapshot(nv, self.now);
        let answer = json!({ "nodeName": name, "providerID": pid });
        match joining(&snap, &id, &group, &answer) {
            Ok(pn) => self.create(Kind::PendingNode, &pn),
            Err(e) => panic!("a good answer refused: {e}"),
        }
    }

    fn patch_object(&mut self, kind: Kind, name: &str, patch: &Value) -> bool {
        let rv = self.bump();
        let want = patch["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        let mut patch = patch.clone();
        if let Some(m) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        match kind {
            Kind::NodeVersion => {
                let ok = patched(&mut self.nv, &want, &patch, &rv);
                let ids = surge_requests(&self.nv).into_iter().map(|(id, _)| id);
                self.requests.extend(ids);
                ok
            }
            Kind::PendingNode => match self.pending.iter_mut().find(|p| p.name_any() == name) {
                Some(p) => patched(p, &want, &patch, &rv),
                None => false,
            },
            Kind::ScalingGroup => match self.groups.iter_mut().find(|g| g.name_any() == name) {
                Some(g) => patched(g, &want, &patch, &rv),
                None => false,
            },
            Kind::AutoscalingStrategy => match self.strategy.as_mut() {
                Some(st) if st.name_any() == name => patched(st, &want, &patch, &rv),
                _ => false,
            },
            other => panic!("a write to a kind the worlds do not hold: {other:?}"),
        }
    }

    fn create(&mut self, kind: Kind, object: &Value) -> bool {
        assert_eq!(kind, Kind::PendingNode, "creates only PendingNodes");
        let mut p: PendingNode = match serde_json::from_value(object.clone()) {
            Ok(p) => p,
            Err(e) => panic!("a PendingNode the API server would refuse: {e}"),
        };
        if self.pending.iter().any(|x| x.name_any() == p.name_any()) {
            // AlreadyExists: the executor reads it as done.
            return true;
        }
        p.metadata.uid = Some(format!("pn-{}-{}", p.name_any(), self.rv));
        p.metadata.resource_version = Some(self.bump());
        p.metadata.creation_timestamp = Some(Time(self.now));
        self.pending.push(p);
        true
    }

    /// Only a node the NodeVersion's NodeMaintenance drained is deleted,
    /// and a control plane only once it left etcd.
    fn delete_node(&mut self, name: &str, uid: Option<&str>) -> bool {
        let control_plane = self
            .nodes
            .iter()
            .any(|n| n.name_any() == name && n.labels().contains_key(CONTROL_PLANE_LABEL));
        assert!(
            !control_plane || self.etcd_removed.contains(name),
            "control plane {name} deleted while still an etcd member"
        );
        let drained = self.nms.iter().any(|m| {
            m.spec.node_name == name
                && !m.name_any().starts_with("admin-")
                && m.status.as_ref().and_then(|s| s.phase) == Some(Phase::Succeeded)
        });
        assert!(
            drained,
            "node {name} deleted without a drain of ours that succeeded"
        );
        self.nodes
            .retain(|n| !(n.name_any() == name && (uid.is_none() || n.uid().as_deref() == uid)));
        self.deleted += 1;
        true
    }

    /// Never on a node an opted-out pod or someone else holds, or whose
    /// pods were not read.
    fn create_maintenance(&mut self, nm: &NodeMaintenance) -> bool {
        let n = nm.spec.node_name.clone();
        assert!(
            !self.opted_out.contains(&n) && !self.unread.contains(&n),
            "{} created on {n} while {}",
            nm.name_any(),
            if self.opted_out.contains(&n) {
                "a pod opted out"
            } else {
                "its pods were not read"
            }
        );
        if self.nms.iter().any(|m| m.spec.node_name == n) {
            assert!(
                self.nms.iter().any(|m| m.name_any() == nm.name_any()),
                "{} created on {n}, which another NodeMaintenance holds",
                nm.name_any()
            );
            return true;
        }
        let mut m = nm.clone();
        m.metadata.uid = Some(format!("uid-{}-{}", m.name_any(), self.rv));
        m.metadata.resource_version = Some(self.bump());
        m.metadata.creation_timestamp = Some(Time(self.now));
        self.nms.push(m);
        true
    }
}

/// A merge patch on `o`, guarded by `want` when given, as the API server
/// applies it; false on a conflict.
fn patched<T>(o: &mut T, want: &Option<String>, patch: &Value, rv: &str) -> bool
where
    T: serde::Serialize + serde::de::DeserializeOwned + kube::ResourceExt,
{
    if want.is_some() && *want != o.resource_version() {
        return false;
    }
    let mut v = serde_json::to_value(&*o).unwrap_or_default();
    merge(&mut v, patch);
    v["metadata"]["resourceVersion"] = json!(rv);
    match serde_json::from_value(v) {
        Ok(x) => {
            *o = x;
            true
        }
        Err(e) => panic!("{}: a patch the API server would refuse: {e}", o.name_any()),
    }
}

/// An effect, short enough for the trace.
fn short(e: &Effect) -> String {
    format!("{e:?}").chars().take(160).collect()
}
