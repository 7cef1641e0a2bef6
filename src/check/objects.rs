//! The objects `check` judges: StorageVersions, lists of them, and AdmissionReviews; and
//! CustomResourceDefinitions (and lists of them), whose apply it judges ([`crate::crd::upgrade`]).

use std::path::Path;

use serde::de::Deserializer;
use serde::Deserialize;

use crate::admission::{ADMISSION_API_VERSION, ADMISSION_KIND};
use crate::crd::types::{Crd, API_VERSION as CRD_API_VERSION, KIND as CRD_KIND};
use crate::model::{StorageVersion, API_VERSION, GROUP, KIND, LIST_KIND, PLURAL};

use super::input::{
    decode_file, decode_items, read_input, reject, Header, InputError, ItemHeader, Shape,
};
use super::report::{describe_item, describe_kind, Skip, Source};

/// One write to judge.
pub struct Subject {
    pub source: Source,
    /// The operation of an AdmissionReview; `None` for plain objects.
    pub operation: Option<String>,
    pub new: StorageVersion,
    /// The stored object the write replaces (an AdmissionReview's `request.oldObject`).
    pub old: Option<StorageVersion>,
}

/// The parts of an AdmissionReview that `check` uses.
#[derive(Deserialize)]
pub struct Review {
    #[serde(default)]
    request: Option<ReviewRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewRequest {
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    resource: Option<ReviewResource>,
    #[serde(default)]
    object: Option<StorageVersion>,
    #[serde(default)]
    old_object: Option<StorageVersion>,
}

#[derive(Deserialize)]
struct ReviewResource {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resource: String,
}

/// What a document of an objects file is decoded as.
enum ObjectShape {
    One,
    /// A list; `true` for the items that are StorageVersions.
    List(Vec<bool>),
    Review,
    Crd,
    /// A list holding CRDs; `true` for the items that are.
    CrdList(Vec<bool>),
    Reject(String),
}

enum ObjectDoc {
    One(Box<StorageVersion>),
    List(Vec<Option<StorageVersion>>),
    Review(Box<Review>),
    Crd(Box<Crd>),
    CrdList(Vec<Option<Crd>>),
}

/// A CRD of a file, to judge the apply of.
pub struct CrdSubject {
    pub source: Source,
    pub crd: Crd,
}

/// Everything `check` found in one file.
#[derive(Default)]
pub struct Loaded {
    pub subjects: Vec<Subject>,
    pub crds: Vec<CrdSubject>,
    pub skipped: Vec<Skip>,
}

impl Shape for ObjectShape {
    type Decoded = ObjectDoc;

    fn decode<'de, D: Deserializer<'de>>(&self, d: D) -> Result<ObjectDoc, D::Error> {
        match self {
            ObjectShape::One => {
                StorageVersion::deserialize(d).map(|sv| ObjectDoc::One(Box::new(sv)))
            }
            ObjectShape::List(wanted) => decode_items(d, wanted).map(ObjectDoc::List),
            ObjectShape::Review => Review::deserialize(d).map(|r| ObjectDoc::Review(Box::new(r))),
            ObjectShape::Crd => Crd::deserialize(d).map(|c| ObjectDoc::Crd(Box::new(c))),
            ObjectShape::CrdList(wanted) => decode_items(d, wanted).map(ObjectDoc::CrdList),
            ObjectShape::Reject(why) => reject(d, why),
        }
    }
}

fn is_storage_version(api_version: Option<&str>, kind: Option<&str>, kind_optional: bool) -> bool {
    let kind_ok = kind.map_or(kind_optional, |k| k == KIND);
    kind_ok && api_version.is_none_or(|v| v == API_VERSION)
}

fn is_crd(api_version: Option<&str>, kind: Option<&str>) -> bool {
    kind == Some(CRD_KIND) && api_version.is_none_or(|v| v == CRD_API_VERSION)
}

fn object_shape(h: &Header) -> ObjectShape {
    let api_version = h.api_version.as_deref();
    let crd_items = || -> Vec<bool> {
        h.items
            .iter()
            .map(|i| is_crd(i.api_version.as_deref(), i.kind.as_deref()) || i.kind.is_none())
            .collect()
    };
    let any_crd = h
        .items
        .iter()
        .any(|i| is_crd(i.api_version.as_deref(), i.kind.as_deref()));
    let items = |kind_optional: bool| -> Vec<bool> {
        h.items
            .iter()
            .map(|i| is_storage_version(i.api_version.as_deref(), i.kind.as_deref(), kind_optional))
            .collect()
    };
    match h.kind.as_deref() {
        Some(KIND) if is_storage_version(api_version, Some(KIND), false) => ObjectShape::One,
        Some(CRD_KIND) if is_crd(api_version, Some(CRD_KIND)) => ObjectShape::Crd,
        Some("CustomResourceDefinitionList")
            if api_version.is_none_or(|v| v == CRD_API_VERSION) =>
        {
            ObjectShape::CrdList(crd_items())
        }
        // A generic List with CRDs in it (`kubectl get crd -o yaml`): its CRDs are judged.
        Some("List") if any_crd && api_version.is_none_or(|v| v == "v1") => ObjectShape::CrdList(
            h.items
                .iter()
                .map(|i| is_crd(i.api_version.as_deref(), i.kind.as_deref()))
                .collect(),
        ),
        // Items of a typed list may leave out their kind; those of a generic List may not.
        Some(LIST_KIND) if api_version.is_none_or(|v| v == API_VERSION) => {
            ObjectShape::List(items(true))
        }
        Some("List") if api_version.is_none_or(|v| v == "v1") => ObjectShape::List(items(false)),
        Some(ADMISSION_KIND) if api_version == Some(ADMISSION_API_VERSION) => ObjectShape::Review,
        kind => ObjectShape::Reject(format!(
            "{}: expected a StorageVersion or StorageVersionList ({API_VERSION}), a List of \
             them, an AdmissionReview ({ADMISSION_API_VERSION}), or a CustomResourceDefinition \
             ({CRD_API_VERSION}) or a list of them",
            describe_kind(api_version, kind)
        )),
    }
}

/// The writes to judge in one file, its CRDs, and the list items (or reviews) that are not
/// judged.
pub fn load(path: &Path) -> Result<Loaded, InputError> {
    let file = read_input(path)?;
    let docs = decode_file(&file, object_shape)?;
    let mut loaded = Loaded::default();
    let Loaded {
        subjects,
        crds,
        skipped,
    } = &mut loaded;
    for doc in docs {
        let source = |item: Option<usize>| Source {
            file: file.name.clone(),
            document: doc.index,
            item,
        };
        match doc.value {
            ObjectDoc::One(sv) => subjects.push(Subject {
                source: source(None),
                operation: None,
                new: *sv,
                old: None,
            }),
            ObjectDoc::List(items) => {
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        Some(new) => subjects.push(Subject {
                            source: source(Some(i)),
                            operation: None,
                            new,
                            old: None,
                        }),
                        None => {
                            skipped.push(skipped_item(source(Some(i)), doc.header.items.get(i)))
                        }
                    }
                }
            }
            ObjectDoc::Crd(crd) => crds.push(CrdSubject {
                source: source(None),
                crd: *crd,
            }),
            ObjectDoc::CrdList(items) => {
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        Some(crd) => crds.push(CrdSubject {
                            source: source(Some(i)),
                            crd,
                        }),
                        None => skipped.push(Skip {
                            source: source(Some(i)),
                            reason: format!(
                                "{} is not a CustomResourceDefinition (in a list of CRDs; give StorageVersions in a file or list of their own)",
                                doc.header.items.get(i).map_or_else(|| "the item".to_string(), describe_item)
                            ),
                        }),
                    }
                }
            }
            ObjectDoc::Review(review) => match review_subject(*review, source(None)) {
                Ok(subject) => subjects.push(subject),
                Err(ReviewOutcome::Skip(skip)) => skipped.push(skip),
                Err(ReviewOutcome::Unusable(message)) => {
                    return Err(InputError {
                        file: file.name.clone(),
                        location: None,
                        message: format!("document {}: {message}", doc.index),
                    })
                }
            },
        }
    }
    Ok(loaded)
}

fn skipped_item(source: Source, header: Option<&ItemHeader>) -> Skip {
    let what = header.map_or_else(|| "the item".to_string(), describe_item);
    Skip {
        source,
        reason: format!("{what} is not a StorageVersion"),
    }
}

enum ReviewOutcome {
    /// A review the webhook would allow without judging it.
    Skip(Skip),
    /// A review the webhook would answer with an error.
    Unusable(String),
}

/// The write an AdmissionReview asks about, judged like the webhook judges it: only CREATE and
/// UPDATE of storageversions, with `oldObject` (on UPDATE) as the stored object.
fn review_subject(review: Review, source: Source) -> Result<Subject, ReviewOutcome> {
    let Some(request) = review.request else {
        return Err(ReviewOutcome::Unusable(
            "the AdmissionReview has no request".to_string(),
        ));
    };
    let skip = |reason: String| {
        ReviewOutcome::Skip(Skip {
            source: source.clone(),
            reason,
        })
    };
    if let Some(r) = &request.resource {
        if r.group != GROUP || r.resource != PLURAL {
            return Err(skip(format!(
                "an AdmissionReview for {}{}{}, not for {PLURAL}.{GROUP}: the webhook allows it",
                r.resource,
                if r.group.is_empty() { "" } else { "." },
                r.group
            )));
        }
    }
    let operation = request.operation;
    match operation.as_deref() {
        None | Some("CREATE" | "UPDATE") => {}
        Some(op) => {
            return Err(skip(format!(
                "an AdmissionReview of a {op}: the webhook allows it without judging"
            )))
        }
    }
    let Some(new) = request.object else {
        return Err(ReviewOutcome::Unusable(
            "request.object is missing: cannot judge a StorageVersion write without it".to_string(),
        ));
    };
    if let Some(kind) = new.kind.as_deref().filter(|k| *k != KIND) {
        return Err(skip(format!(
            "request.object is a {kind}, not a StorageVersion: the webhook allows it"
        )));
    }
    let old = match operation.as_deref() {
        Some("CREATE") => None,
        _ => request.old_object,
    };
    Ok(Subject {
        source,
        operation,
        new,
        old,
    })
}
