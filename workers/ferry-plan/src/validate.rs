//! The plan command's rules, checked before anything runs; each rejection names the step
//! (`steps[i] (<name>)`), the field and the rule.

use std::collections::{HashMap, HashSet};

use ferry_kube::names::{is_dns1123_label, is_dns1123_subdomain, is_label_key, is_label_value};
use ferry_task::kind::KindInfo;
use ferry_task::{Rejection, TaskKind};

use crate::refs;
use crate::spec::{ForEach, OnFailure, PlanSpec, PlanStep};
use crate::steps::select::MAX_CLUSTERS;
use crate::steps::waves;

/// Children of one plan, at most: each is a step of the plan's journal, which rides in its
/// snapshot with the children's outputs.
pub const MAX_STEPS: usize = 50;

/// The schemas a child's spec is checked against (this program's, as the child's worker
/// has them).
static REGISTRY: std::sync::LazyLock<ferry_task::wire::Registry> = std::sync::LazyLock::new(ferry_task::wire::Registry::embedded);

/// Longest step name (a Kubernetes label value's limit: names may end up in ones).
const NAME_LEN: usize = 63;

/// Checks `spec`: step names, kinds, specs, subjects and every reference.
pub fn validate(spec: &PlanSpec) -> Result<(), Rejection> {
    if spec.steps.is_empty() {
        return Err(Rejection::new("steps: a plan needs at least one step"));
    }
    if spec.steps.len() > MAX_STEPS {
        return Err(Rejection::new(format!("steps: a plan has at most {MAX_STEPS} steps, got {}", spec.steps.len())));
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, s) in spec.steps.iter().enumerate() {
        let at = format!("steps[{i}]");
        if !is_dns1123_label(&s.name) {
            return Err(Rejection::new(format!(
                "{at}.name {:?}: 1 to {NAME_LEN} lowercase letters, digits and '-', starting and ending with a letter or digit",
                s.name
            )));
        }
        if let Some(first) = index.insert(&s.name, i) {
            return Err(Rejection::new(format!("{at}.name {:?}: steps[{first}] has that name already; step names are unique in a plan", s.name)));
        }
    }
    for (i, s) in spec.steps.iter().enumerate() {
        let at = format!("steps[{i}] ({})", s.name);
        let kind: TaskKind = s.kind.parse().map_err(|e| Rejection::new(format!("{at}.kind: {e}")))?;
        if kind == TaskKind::PLAN {
            return Err(Rejection::new(format!("{at}.kind: a plan does not run plans (put their steps in this one)")));
        }
        let value = s.spec_value().map_err(|e| Rejection::new(format!("{at}.spec: not JSON: {e}")))?;
        if !value.is_object() {
            return Err(Rejection::new(format!("{at}.spec: the {kind} kind's fields, an object; got {value}")));
        }
        match &s.subject {
            Some(subject) if subject.trim().is_empty() => return Err(Rejection::new(format!("{at}.subject: empty (leave it out to derive it)"))),
            None if ferry_task::kind::info(kind).and_then(|i| i.derived_subject).is_none() => {
                return Err(Rejection::new(format!("{at}.subject: required for a {kind} child (its spec names no subject)")));
            }
            _ => {}
        }
        if let Some(each) = &s.for_each {
            for_each(&at, s, each, &value)?;
        }
        let mut found = refs::in_value(&value, "spec").map_err(|e| Rejection::new(format!("{at}.spec: {e}")))?;
        if let Some(subject) = &s.subject {
            let in_subject = refs::in_text(subject).map_err(|e| Rejection::new(format!("{at}.subject: {e}")))?;
            found.extend(in_subject.into_iter().map(|(_, r)| ("subject".to_owned(), r)));
        }
        // A child that refers to nothing earlier is what it will be: its kind reads it now
        // ([`child`]). A fanned-out step's children too, one per cluster it names (those
        // chosen by labels or a set are known only when the step runs).
        if found.is_empty()
            && let Some(info) = ferry_task::kind::info(kind)
        {
            match &s.for_each {
                None => child(&at, info, s.subject.as_deref(), &value)?,
                Some(each) => {
                    let mut children = Vec::new();
                    for c in &each.clusters {
                        let spec = waves::spec_for(s, each, c).map_err(|e| Rejection::new(format!("{at}: {}", e.message)))?;
                        children.push((c.clone(), waves::subject_for(s, c), spec));
                    }
                    fanned_children(&at, info, &children)?;
                }
            }
        }
        for (field, r) in found {
            match index.get(r.step.as_str()) {
                None => {
                    let names: Vec<&str> = spec.steps.iter().map(|s| s.name.as_str()).collect();
                    return Err(Rejection::new(format!("{at}.{field}: {r} refers to no step named {:?} (the steps are: {})", r.step, names.join(", "))));
                }
                Some(&j) if j >= i => {
                    let which = if j == i { "itself".to_owned() } else { format!("steps[{j}], which runs after it") };
                    return Err(Rejection::new(format!("{at}.{field}: {r} refers to {which}; a step may refer only to earlier steps")));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// A child the plan can read now, checked as its kind will check it: its fields (unknown
/// ones too, [`ferry_task::kind::encode_json`]) and its kind's own rules with the subject it
/// will be sent with ([`ferry_task::kind::KindInfo::check`]). So a plan never runs its
/// first children and reverts them for a later one that could not be sent, or that its
/// worker then Rejected.
fn child(at: &str, info: &KindInfo, subject: Option<&str>, spec: &serde_json::Value) -> Result<(), Rejection> {
    (info.encode)(&REGISTRY, spec.clone()).map_err(|e| Rejection::new(format!("{at}.spec: {e}")))?;
    if let Some(subject) = subject.map(str::to_owned).or_else(|| (info.subject_of)(spec)) {
        (info.check)(&subject, spec).map_err(|r| Rejection::new(format!("{at}: the {} kind refuses this child: {}", info.kind, r.reason)))?;
    }
    Ok(())
}

/// A fanned-out step's children (cluster, the subject given, the spec; earlier outputs put
/// in), checked before any is sent: each as its kind will check it ([`child`]), and no two
/// on one subject. A subject names what a task acts on: two children on one would act on
/// the same thing, and the second would find the first's work (a deploy's app is one per
/// `<namespace>/<name>` on the hub, whatever its clusters).
pub(crate) fn fanned_children(at: &str, info: &KindInfo, children: &[waves::ChildAt]) -> Result<(), Rejection> {
    for (cluster, subject, spec) in children {
        child(&format!("{at} for {cluster}"), info, subject.as_deref(), spec)?;
    }
    shared_subject(at, info, children)
}

/// Refuses children of one fanned-out step that would act on one subject (see
/// [`fanned_children`]), saying where `${cluster}` goes.
pub(crate) fn shared_subject(at: &str, info: &KindInfo, children: &[waves::ChildAt]) -> Result<(), Rejection> {
    let mut subjects: HashMap<String, &str> = HashMap::new();
    for (cluster, subject, spec) in children {
        let Some(subject) = subject.clone().or_else(|| (info.subject_of)(spec)) else { continue };
        if let Some(first) = subjects.insert(subject.clone(), cluster) {
            let put = match (info.derived_subject, children.iter().any(|(_, s, _)| s.is_some())) {
                (Some(derived), false) => format!("a {} task's subject is {derived}: put {} in one of its parts in the spec", info.kind, refs::CLUSTER),
                _ => format!("put {} in the step's subject", refs::CLUSTER),
            };
            return Err(Rejection::new(format!(
                "{at}: its children for {first} and {cluster} would both act on subject {subject:?}, one {} task after the other on the same thing; {put}",
                info.kind
            )));
        }
    }
    Ok(())
}

/// Longest wait a wave's pause or soak may ask for (a day): past it, a person should
/// approve the next wave rather than a timer.
const MAX_WAIT_SECONDS: i64 = 86_400;

/// The rules of a fanned-out step: one way of choosing clusters, valid waves and policy,
/// overrides that apply, and `${cluster}` used somewhere (else every child would be the
/// same command).
fn for_each(at: &str, s: &PlanStep, each: &ForEach, spec: &serde_json::Value) -> Result<(), Rejection> {
    let at = format!("{at}.for_each");
    let ways = usize::from(!each.clusters.is_empty()) + usize::from(!each.labels.is_empty()) + usize::from(each.cluster_set.is_some());
    if ways != 1 {
        return Err(Rejection::new(format!("{at}: choose the clusters one way: clusters (names), labels, or cluster_set (got {ways})")));
    }
    if each.clusters.len() > MAX_CLUSTERS {
        return Err(Rejection::new(format!("{at}.clusters: at most {MAX_CLUSTERS}, got {}", each.clusters.len())));
    }
    let mut seen = HashSet::new();
    for (i, c) in each.clusters.iter().enumerate() {
        if !is_dns1123_subdomain(c) {
            return Err(Rejection::new(format!("{at}.clusters[{i}] {c:?}: not a cluster name (a DNS-1123 subdomain)")));
        }
        if let Some(why) = ferry_kube::names::hub_named(c) {
            return Err(Rejection::new(format!("{at}.clusters[{i}]: {why}")));
        }
        if !seen.insert(c.as_str()) {
            return Err(Rejection::new(format!("{at}.clusters[{i}] {c:?}: listed twice")));
        }
    }
    for (k, v) in &each.labels {
        if !is_label_key(k) || !is_label_value(v) {
            return Err(Rejection::new(format!("{at}.labels {k:?}: {v:?}: not a Kubernetes label (a qualified name, and a value of at most 63 letters, digits, '-', '_' or '.')")));
        }
    }
    if let Some(set) = &each.cluster_set
        && !is_dns1123_subdomain(set)
    {
        return Err(Rejection::new(format!("{at}.cluster_set {set:?}: not a ManagedClusterSet name (a DNS-1123 subdomain)")));
    }
    let w = &each.waves;
    if w.size < 0 || w.max_in_flight < 0 {
        return Err(Rejection::new(format!("{at}.waves: size and max_in_flight are 0 (the whole list, the whole wave) or more")));
    }
    for (name, v) in [("pause_seconds", w.pause_seconds), ("soak_seconds", w.soak_seconds)] {
        if !(0..=MAX_WAIT_SECONDS).contains(&v) {
            return Err(Rejection::new(format!("{at}.waves.{name}: 0 to {MAX_WAIT_SECONDS}, got {v}")));
        }
    }
    if let Some(score) = w.gate.as_ref().and_then(|g| g.score.as_ref()) {
        if !is_dns1123_subdomain(&score.name) {
            return Err(Rejection::new(format!("{at}.waves.gate.score.name {:?}: not an AddOnPlacementScore name (a DNS-1123 subdomain)", score.name)));
        }
        if score.item.is_empty() || score.item.len() > 253 {
            return Err(Rejection::new(format!("{at}.waves.gate.score.item: name an item of the score's status.scores (1 to 253 characters)")));
        }
        if !(-100..=100).contains(&score.min) {
            return Err(Rejection::new(format!("{at}.waves.gate.score.min: -100 to 100 (OCM's score range), got {}", score.min)));
        }
    }
    if OnFailure::parse(each.on_failure.as_deref()).is_none() {
        return Err(Rejection::new(format!("{at}.on_failure {:?}: one of {}", each.on_failure.as_deref().unwrap_or_default(), OnFailure::NAMES.join(", "))));
    }
    for (i, o) in each.overrides.iter().enumerate() {
        let patch: serde_json::Value = serde_json::from_str(&o.spec).map_err(|e| Rejection::new(format!("{at}.overrides[{i}].spec: not JSON: {e}")))?;
        if !patch.is_object() {
            return Err(Rejection::new(format!("{at}.overrides[{i}].spec: a merge patch of the spec, an object; got {patch}")));
        }
        if o.clusters.is_empty() {
            return Err(Rejection::new(format!("{at}.overrides[{i}].clusters: name the clusters it applies to")));
        }
        if !each.clusters.is_empty()
            && let Some(c) = o.clusters.iter().find(|c| !each.clusters.contains(c))
        {
            return Err(Rejection::new(format!("{at}.overrides[{i}].clusters: {c:?} is not one of the step's clusters")));
        }
    }
    let in_subject = s.subject.as_deref().is_some_and(|x| x.contains(refs::CLUSTER));
    if !in_subject && !refs::uses_cluster(spec) {
        return Err(Rejection::new(format!(
            "{}: neither the spec nor the subject uses {}: every cluster would get the same command",
            at.trim_end_matches(".for_each"),
            refs::CLUSTER
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    // The kinds these tests name, registered as stand-ins (the plan crate links no other
    // worker crate): whether a kind derives its subject is what the rules read. Each reads
    // a field `unknown` as its worker would an unknown one, refuses `steps: 0` and a
    // subject `hub`, as the kinds' own rules do.
    const fn stand_in(kind: TaskKind, derived_subject: Option<&'static str>) -> KindInfo {
        KindInfo {
            derived_subject,
            encode: |_, spec| if spec.get("unknown").is_some() { Err("unknown field `unknown`".to_owned()) } else { Ok(Vec::new()) },
            check: |subject, spec| match (subject, spec.get("steps")) {
                ("hub", _) => Err(Rejection::new("the subject hub is not a cluster")),
                (_, Some(n)) if *n == 0 => Err(Rejection::new("steps must be 1 to 100, got 0")),
                _ => Ok(()),
            },
            subject_of: |spec| spec.get("name").and_then(serde_json::Value::as_str).map(|n| format!("fleet/{n}")),
            ..KindInfo::bare(kind)
        }
    }
    ferry_task::register_kind!(stand_in(TaskKind::TEST, None));
    ferry_task::register_kind!(stand_in(TaskKind::CREATE_CLUSTER, Some("<namespace>/<name>")));
    ferry_task::register_kind!(stand_in(TaskKind::PEER, Some("the pair")));

    fn plan(steps: serde_json::Value) -> PlanSpec {
        serde_json::from_value(json!({ "steps": steps })).unwrap()
    }

    fn reason(steps: serde_json::Value) -> String {
        validate(&plan(steps)).unwrap_err().reason
    }

    #[test]
    fn a_plan_with_backward_references_is_valid() {
        validate(&plan(json!([
            {"name": "create", "kind": "create-cluster", "spec": {"name": "edge-1"}},
            {"name": "peer", "kind": "peer", "spec": {"a": "hub-1", "b": "${steps.create.outputs.register.cluster}"}},
            {"name": "check", "kind": "test", "subject": "${steps.peer.subject}", "spec": {"steps": 1}, "keep": true},
        ])))
        .unwrap();
    }

    #[test]
    fn unknown_and_later_steps_are_refused_precisely() {
        let steps = |r: &str| json!([
            {"name": "one", "kind": "test", "subject": "s", "spec": {"steps": 1}},
            {"name": "two", "kind": "test", "subject": "s", "spec": {"steps": 1, "note": r}},
            {"name": "three", "kind": "test", "subject": "s", "spec": {"steps": 1}},
        ]);
        assert_eq!(
            reason(steps("${steps.four.task_id}")),
            "steps[1] (two).spec.note: ${steps.four.task_id} refers to no step named \"four\" (the steps are: one, two, three)"
        );
        assert_eq!(
            reason(steps("${steps.three.task_id}")),
            "steps[1] (two).spec.note: ${steps.three.task_id} refers to steps[2], which runs after it; a step may refer only to earlier steps"
        );
        assert_eq!(reason(steps("${steps.two.task_id}")), "steps[1] (two).spec.note: ${steps.two.task_id} refers to itself; a step may refer only to earlier steps");
        assert!(reason(steps("${steps.one.output}")).starts_with("steps[1] (two).spec: ${steps.one.output}: a reference is"));
    }

    /// A child its kind's own rules refuse refuses the plan at submit, named, instead of
    /// being Rejected by its worker once the children before it ran (they were reverted
    /// then). So does each named cluster's child of a fanned-out step, with its overrides
    /// and its subject; a child that refers to an earlier one is checked when it is sent.
    #[test]
    fn a_child_its_kind_would_refuse_refuses_the_plan() {
        let first = json!({"name": "a", "kind": "test", "subject": "s", "spec": {"steps": 1}});
        let with = |second: serde_json::Value| reason(json!([first, second]));
        assert_eq!(with(json!({"name": "b", "kind": "test", "subject": "s", "spec": {"steps": 0}})), "steps[1] (b): the test kind refuses this child: steps must be 1 to 100, got 0");
        assert_eq!(with(json!({"name": "b", "kind": "test", "subject": "hub", "spec": {}})), "steps[1] (b): the test kind refuses this child: the subject hub is not a cluster");
        let fanned = |overrides: serde_json::Value, subject: &str| {
            reason(json!([{"name": "roll", "kind": "test", "subject": subject, "spec": {"steps": 1},
                "for_each": {"clusters": ["c1", "c2"], "overrides": overrides}}]))
        };
        assert_eq!(
            fanned(json!([{"clusters": ["c2"], "spec": {"steps": 0}}]), "${cluster}"),
            "steps[0] (roll) for c2: the test kind refuses this child: steps must be 1 to 100, got 0"
        );
        assert_eq!(
            fanned(json!([{"clusters": ["c1"], "spec": {"unknown": 1}}]), "${cluster}"),
            "steps[0] (roll) for c1.spec: unknown field `unknown`"
        );
        let hub = reason(json!([{"name": "roll", "kind": "test", "subject": "hub", "spec": {"note": "${cluster}"}, "for_each": {"clusters": ["c1"]}}]));
        assert_eq!(hub, "steps[0] (roll) for c1: the test kind refuses this child: the subject hub is not a cluster");
        // Not known yet: a child whose spec refers to an earlier one's outputs, and the
        // children of clusters chosen by labels.
        validate(&plan(json!([
            first,
            {"name": "b", "kind": "test", "subject": "s", "spec": {"steps": 0, "note": "${steps.a.task_id}"}},
            {"name": "roll", "kind": "test", "subject": "${cluster}", "spec": {"steps": 0}, "for_each": {"labels": {"env": "prod"}}},
        ])))
        .unwrap();
    }

    /// A fanned-out step whose children would share a subject is refused, and the message
    /// says where `${cluster}` goes: the given subject, or the spec a kind derives it from.
    #[test]
    fn fanned_out_children_on_one_subject_refuse_the_plan() {
        let given = reason(json!([{"name": "roll", "kind": "test", "subject": "shared", "spec": {"note": "${cluster}"}, "for_each": {"clusters": ["c1", "c2"]}}]));
        assert_eq!(
            given,
            "steps[0] (roll): its children for c1 and c2 would both act on subject \"shared\", one test task after the other on the same thing; put ${cluster} in the step's subject"
        );
        let derived = reason(json!([{"name": "roll", "kind": "create-cluster", "spec": {"name": "edge", "note": "${cluster}"}, "for_each": {"clusters": ["c1", "c2", "c3"]}}]));
        assert_eq!(
            derived,
            "steps[0] (roll): its children for c1 and c2 would both act on subject \"fleet/edge\", one create-cluster task after the other on the same thing; a create-cluster task's subject is <namespace>/<name>: put ${cluster} in one of its parts in the spec"
        );
        validate(&plan(json!([{"name": "roll", "kind": "create-cluster", "spec": {"name": "edge-${cluster}"}, "for_each": {"clusters": ["c1", "c2"]}}]))).unwrap();
    }

    #[test]
    fn names_kinds_specs_and_subjects_are_checked() {
        assert_eq!(reason(json!([])), "steps: a plan needs at least one step");
        let one = |s: serde_json::Value| reason(json!([s]));
        assert!(one(json!({"name": "Bad_Name", "kind": "test", "subject": "s", "spec": {}})).starts_with("steps[0].name \"Bad_Name\": 1 to 63"));
        assert!(one(json!({"name": "a", "kind": "build", "subject": "s", "spec": {}})).starts_with("steps[0] (a).kind: unknown task kind \"build\""));
        assert_eq!(one(json!({"name": "a", "kind": "plan", "subject": "s", "spec": {}})), "steps[0] (a).kind: a plan does not run plans (put their steps in this one)");
        assert_eq!(one(json!({"name": "a", "kind": "test", "spec": {}})), "steps[0] (a).subject: required for a test child (its spec names no subject)");
        assert_eq!(one(json!({"name": "a", "kind": "test", "subject": "s", "spec": [1]})), "steps[0] (a).spec: the test kind's fields, an object; got [1]");
        // A child's spec its kind cannot read is refused before anything runs; one that
        // refers to an earlier step is read when it is sent (the references filled in).
        assert_eq!(one(json!({"name": "a", "kind": "test", "subject": "s", "spec": {"steps": 1, "unknown": 1}})), "steps[0] (a).spec: unknown field `unknown`");
        validate(&plan(json!([
            {"name": "a", "kind": "test", "subject": "s", "spec": {}},
            {"name": "b", "kind": "test", "subject": "s", "spec": {"unknown": "${steps.a.task_id}"}},
        ])))
        .unwrap();
        let twice = reason(json!([
            {"name": "a", "kind": "test", "subject": "s", "spec": {}},
            {"name": "a", "kind": "test", "subject": "s", "spec": {}},
        ]));
        assert_eq!(twice, "steps[1].name \"a\": steps[0] has that name already; step names are unique in a plan");
    }
}
