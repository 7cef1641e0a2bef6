//! The upgrade timeline: what the HA end-to-end tests record (JSON), and its picture (PNG, drawn
//! with `plotters`). Shared by tests/support/ha.rs and examples/upgrade_timeline.rs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One run of an upgrade (or other scenario), as seen by a poller listing every StorageVersion.
/// Times are seconds since the recorder started.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timeline {
    /// Which collector ran ("storageversion-webhook", "kube-controller-manager", ...).
    pub collector: String,
    /// How many apiservers the control plane has.
    pub apiservers: usize,
    /// The minor every apiserver ran when the recorder started.
    #[serde(default)]
    pub initial_version: String,
    /// Objects whose every status change was kept, in the order they are drawn.
    pub interest: Vec<String>,
    pub duration: f64,
    /// Stops and starts of apiservers, and other test actions.
    pub events: Vec<Event>,
    /// Presence of each (object, apiserver ID) entry, per encoding version.
    pub segments: Vec<Segment>,
    /// Presence of each identity lease (`object` = "lease").
    pub leases: Vec<Segment>,
    /// Every change of an object's `commonEncodingVersion` (None: absent).
    pub common: Vec<CommonChange>,
    /// StorageVersions created or deleted during the run.
    pub objects: Vec<ObjectEvent>,
    /// Per listing: how many objects, and how many hold an entry of each apiserver.
    pub counts: Vec<CountSample>,
    /// Apiserver index -> its ID (identity lease name).
    #[serde(default)]
    pub ids: BTreeMap<usize, String>,
    pub polls: u64,
    pub poll_errors: u64,
    /// The longest time between two successful listings (s).
    pub max_poll_gap: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub t: f64,
    pub apiserver: Option<usize>,
    /// stop, stopped, kill, start, ready, or a free-form test action.
    pub what: String,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Segment {
    pub object: String,
    /// The apiserver ID of the entry (or of the lease).
    pub apiserver: String,
    /// Its index in the control plane (hostname apiserver-<index>), when known.
    pub index: Option<usize>,
    pub encoding: String,
    pub from: f64,
    /// None: still present at the end.
    pub to: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CommonChange {
    pub object: String,
    pub t: f64,
    pub value: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObjectEvent {
    pub object: String,
    pub t: f64,
    pub what: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CountSample {
    pub t: f64,
    pub objects: usize,
    pub with_entry: Vec<usize>,
}

impl Timeline {
    pub fn write_json(&self, path: &Path) -> Result<(), String> {
        let text =
            serde_json::to_string_pretty(self).map_err(|e| format!("encode timeline: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
    }

    pub fn read_json(path: &Path) -> Result<Timeline, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a timeline: {e}", path.display()))
    }

    /// State of apiserver `i` over time, from the events: (from, to, state) where state is a
    /// minor ("1.37"), "stopping", "starting" or "down".
    pub fn apiserver_states(&self, i: usize) -> Vec<(f64, f64, String)> {
        let mut out = Vec::new();
        let mut state = self.initial_version.clone();
        let mut since = 0.0;
        for e in self.events.iter().filter(|e| e.apiserver == Some(i)) {
            let next = match e.what.as_str() {
                "stop" => "stopping".to_string(),
                "stopped" | "kill" => "down".to_string(),
                "start" => "starting".to_string(),
                "ready" => e.detail.clone(),
                _ => continue,
            };
            if next != state {
                out.push((since, e.t, state));
                state = next;
                since = e.t;
            }
        }
        out.push((since, self.duration, state));
        out
    }
}

// ----------------------------------------------------------------------- picture --

use plotters::coord::Shift;
use plotters::prelude::*;

const FONT: &str = "sans-serif";

/// Registers a TrueType font for the picture's text (plotters draws text with `ab_glyph`):
/// `$SVW_TIMELINE_FONT`, else DejaVu Sans from the usual system places.
fn load_font() -> Result<(), String> {
    let mut candidates: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var("SVW_TIMELINE_FONT") {
        candidates.push(p);
    }
    for p in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    ] {
        candidates.push(p.to_string());
    }
    for p in &candidates {
        if let Ok(bytes) = std::fs::read(p) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| format!("{p} is not a usable TrueType font"));
        }
    }
    Err(format!(
        "no TrueType font for the timeline picture (tried {}); install fonts-dejavu-core or set SVW_TIMELINE_FONT",
        candidates.join(", ")
    ))
}

fn version_color(v: &str) -> RGBColor {
    if v.ends_with("v1beta1") || v == "1.36" {
        RGBColor(230, 145, 56) // orange: the older minor / v1beta1
    } else if v.ends_with("/v1") || v == "v1" || v == "1.37" {
        RGBColor(61, 120, 200) // blue: the newer minor / v1
    } else {
        RGBColor(150, 150, 150)
    }
}

const GAP: RGBColor = RGBColor(214, 39, 40);
const TRANSIT: RGBColor = RGBColor(200, 200, 200);

fn short(name: &str) -> String {
    name.rsplit_once('.')
        .map(|(_, r)| r.to_string())
        .unwrap_or_else(|| name.to_string())
}

/// Draws one panel per timeline (stacked) into a PNG of `width` x (`panel_height` x panels).
pub fn render_png(
    timelines: &[(&str, &Timeline)],
    path: &Path,
    width: u32,
    panel_height: u32,
) -> Result<(), String> {
    load_font()?;
    let height = panel_height * timelines.len() as u32 + 60;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (legend, rest) = root.split_vertically(60);
    draw_legend(&legend).map_err(|e| e.to_string())?;
    let panels = rest.split_evenly((timelines.len(), 1));
    let duration = timelines
        .iter()
        .map(|(_, t)| t.duration)
        .fold(1.0f64, f64::max);
    for (area, (title, tl)) in panels.iter().zip(timelines) {
        draw_panel(area, title, tl, duration).map_err(|e| e.to_string())?;
    }
    root.present()
        .map_err(|e| format!("write {}: {e}", path.display()))
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_legend(area: &DrawingArea<BitMapBackend, Shift>) -> DrawResult {
    let items: [(&str, RGBColor); 5] = [
        ("v1beta1 / kube-apiserver 1.36", version_color("1.36")),
        ("v1 / kube-apiserver 1.37", version_color("1.37")),
        ("stopping / starting", TRANSIT),
        ("entry missing (lost)", GAP),
        ("identity lease present", BLACK),
    ];
    let mut x = 20;
    for (label, color) in items {
        area.draw(&Rectangle::new([(x, 22), (x + 24, 40)], color.filled()))?;
        area.draw(&Text::new(label, (x + 30, 24), (FONT, 17).into_font()))?;
        x += 40 + (label.len() as i32) * 9;
    }
    Ok(())
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    title: &str,
    tl: &Timeline,
    duration: f64,
) -> DrawResult {
    let n = tl.apiservers;
    // Rows, top to bottom: apiservers, then per object of interest its entries and its common
    // version.
    let mut rows: Vec<String> = (0..n).map(|i| format!("apiserver-{i}")).collect();
    for obj in &tl.interest {
        for i in 0..n {
            rows.push(format!("{} entry {i}", short(obj)));
        }
        rows.push(format!("{} common", short(obj)));
    }
    let nrows = rows.len();
    let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 * 64 / 100);
    let mut chart = ChartBuilder::on(&top)
        .caption(title, (FONT, 22).into_font())
        .margin(8)
        .x_label_area_size(0)
        .y_label_area_size(300)
        .build_cartesian_2d(0f64..duration, (0..nrows - 1).into_segmented())?;
    let labels = rows.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_y_mesh()
        .y_labels(nrows)
        .y_label_style((FONT, 15).into_font())
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => nrows
                .checked_sub(1 + *i)
                .and_then(|r| labels.get(r))
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    // Row r (0 = top) occupies segment nrows-1-r.
    let band = |r: usize, from: f64, to: f64, color: RGBColor| {
        let y = nrows - 1 - r;
        Rectangle::new(
            [
                (from, SegmentValue::Exact(y)),
                (to, SegmentValue::Exact(y + 1)),
            ],
            color.filled(),
        )
    };
    let mut rects = Vec::new();
    for i in 0..n {
        for (from, to, state) in tl.apiserver_states(i) {
            let color = match state.as_str() {
                "down" => continue,
                "stopping" | "starting" => TRANSIT,
                v => version_color(v),
            };
            rects.push(band(i, from, to, color));
        }
    }
    // Object rows: entries per apiserver index, gaps after a first appearance in red.
    let mut r = n;
    for obj in &tl.interest {
        for i in 0..n {
            let mut segs: Vec<&Segment> = tl
                .segments
                .iter()
                .filter(|s| s.object == *obj && s.index == Some(i))
                .collect();
            segs.sort_by(|a, b| {
                a.from
                    .partial_cmp(&b.from)
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            let mut last_end: Option<f64> = None;
            for s in &segs {
                if let Some(end) = last_end {
                    if s.from > end {
                        rects.push(band(r + i, end, s.from, GAP));
                    }
                }
                let to = s.to.unwrap_or(tl.duration);
                rects.push(band(r + i, s.from, to, version_color(&s.encoding)));
                last_end = Some(to);
            }
            if let Some(end) = last_end {
                if end < tl.duration - 0.01 {
                    rects.push(band(r + i, end, tl.duration, GAP));
                }
            }
        }
        let changes: Vec<&CommonChange> = tl.common.iter().filter(|c| c.object == *obj).collect();
        for (k, c) in changes.iter().enumerate() {
            let to = changes.get(k + 1).map(|n| n.t).unwrap_or(tl.duration);
            if let Some(v) = &c.value {
                rects.push(band(r + n, c.t, to, version_color(v)));
            }
        }
        r += n + 1;
    }
    chart.draw_series(rects)?;
    // Identity leases: a thick black line at the bottom of each apiserver row.
    for s in &tl.leases {
        if let Some(i) = s.index {
            let y = nrows - 1 - i;
            chart.draw_series(LineSeries::new(
                [
                    (s.from, SegmentValue::Exact(y)),
                    (s.to.unwrap_or(tl.duration), SegmentValue::Exact(y)),
                ],
                BLACK.stroke_width(4),
            ))?;
        }
    }
    // Separators between apiserver rows and object groups.
    let mut sep = n;
    for _ in &tl.interest {
        let y = nrows - sep;
        chart.draw_series(LineSeries::new(
            [
                (0.0, SegmentValue::Exact(y)),
                (duration, SegmentValue::Exact(y)),
            ],
            BLACK.mix(0.6).stroke_width(1),
        ))?;
        sep += n + 1;
    }

    // Counts: objects holding an entry of each apiserver, and all objects.
    let max = tl
        .counts
        .iter()
        .map(|c| c.objects)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut counts = ChartBuilder::on(&bottom)
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(300)
        .build_cartesian_2d(0f64..duration, 0f64..max * 1.08)?;
    counts
        .configure_mesh()
        .x_desc("seconds since the recorder started")
        .y_desc("StorageVersions")
        .axis_desc_style((FONT, 15).into_font())
        .label_style((FONT, 14).into_font())
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    counts
        .draw_series(LineSeries::new(
            tl.counts.iter().map(|c| (c.t, c.objects as f64)),
            BLACK.stroke_width(2),
        ))?
        .label("StorageVersions")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    for i in 0..n {
        let color = palette[i % palette.len()];
        counts
            .draw_series(LineSeries::new(
                tl.counts
                    .iter()
                    .map(|c| (c.t, c.with_entry.get(i).copied().unwrap_or(0) as f64)),
                // Wider lines below narrower ones: equal counts stay visible as stripes.
                color.stroke_width(2 + 3 * (n - 1 - i) as u32),
            ))?
            .label(format!("with an entry of apiserver-{i}"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    counts
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14).into_font())
        .draw()?;
    Ok(())
}

/// Panel titles of the upgrade picture.
pub const OURS_TITLE: &str =
    "Rolling upgrade 1.36 -> 1.37 of 3 kube-apiservers, storageversion-webhook's collector (default 30 s grace)";
pub const UPSTREAM_TITLE: &str =
    "The same upgrade with kube-controller-manager's storage-version-gc";
