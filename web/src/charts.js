// Chart.js wrappers. Every chart records what it drew on its canvas
// (data-series="label:points;...") so browser tests can check the data, not pixels.
import { Chart, registerables } from 'chart.js';
import { h, tickLabel } from './dom.js';

Chart.register(...registerables);
Chart.defaults.font.family = 'system-ui, sans-serif';
Chart.defaults.font.size = 11;
Chart.defaults.animation = false;
Chart.defaults.maintainAspectRatio = false;
Chart.defaults.plugins.legend.labels.boxWidth = 10;

export const PALETTE = ['#2f6fde', '#e8772e', '#2aa876', '#c0392b', '#8e5cc4', '#d4a017', '#17a2b8', '#7f8c8d', '#e84393', '#34495e'];

export const REASON_COLORS = {
  completed: '#2aa876',
  max_turns: '#d4a017',
  context_overflow: '#e8772e',
  agent_timeout: '#a0722a',
  engine_error: '#c0392b',
  proxy_error: '#922b21',
  env_setup_failed: '#8e5cc4',
  verifier_error: '#e84393',
  verifier_timeout: '#f19bc1',
  cancelled: '#7f8c8d',
  running: '#9ec5f8',
  unspecified: '#bbbbbb',
};

function describe(datasets) {
  return datasets.map((d) => `${d.label}:${d.data.filter((v) => v !== null && v !== undefined).length}`).join(';');
}

// Every value axis (not the x axis of steps or names) labels its ticks with tickLabel.
function withTickLabels(options) {
  const scales = { ...(options.scales || {}) };
  for (const id of new Set(['y', ...Object.keys(scales)])) {
    if (id === 'x') continue;
    const scale = scales[id] || {};
    scales[id] = { ...scale, ticks: { callback: tickLabel, ...(scale.ticks || {}) } };
  }
  return { ...options, scales };
}

function make(type, labels, datasets, options = {}, height = 190) {
  options = withTickLabels(options);
  const canvas = h('canvas');
  canvas.dataset.series = describe(datasets);
  const x = options.scales && options.scales.x;
  canvas.dataset.xaxis = x && x.title && x.title.display ? x.title.text : '';
  canvas.dataset.labels = labels.join(',');
  canvas.dataset.points = String(datasets.reduce((n, d) => n + d.data.filter((v) => v !== null && v !== undefined).length, 0));
  const box = h('div.chart', { style: `height:${height}px` }, canvas);
  // Chart.js needs the canvas in the document to size it; create on the next frame.
  requestAnimationFrame(() => {
    const chart = new Chart(canvas, { type, data: { labels, datasets }, options });
    canvas.dataset.ready = '1';
    canvas._chart = chart;
  });
  return box;
}

// One step convention on every per-step chart (services/dashboard/README.md, "Steps"):
// step N = the rollouts sampled by the policy after N optimizer updates, and the update
// trained on them (the trainer writes that one as its step N + 1).
export const STEP_AXIS = 'rollout step (policy after N updates)';
const stepAxis = { title: { display: true, text: STEP_AXIS }, grid: { display: false } };

// series: [{label, values: {step: v}, color?, dashed?, axis?}]
// showGaps: a step without a value breaks the line (else the line spans it).
export function lines(stepsList, series, { yTitle = '', yMin, yMax, height, y2Title, showGaps = false } = {}) {
  const datasets = series.map((s, i) => ({
    label: s.label,
    data: stepsList.map((st) => (s.values[st] ?? null)),
    borderColor: s.color || PALETTE[i % PALETTE.length],
    backgroundColor: s.color || PALETTE[i % PALETTE.length],
    borderDash: s.dashed ? [5, 4] : undefined,
    pointRadius: stepsList.length > 40 ? 0 : 2.5,
    spanGaps: !showGaps,
    tension: 0.15,
    yAxisID: s.axis || 'y',
  }));
  const scales = { x: stepAxis, y: { title: { display: !!yTitle, text: yTitle }, min: yMin, max: yMax } };
  if (series.some((s) => s.axis === 'y2')) {
    scales.y2 = { position: 'right', title: { display: !!y2Title, text: y2Title }, grid: { display: false } };
  }
  return make('line', stepsList, datasets, { scales, interaction: { mode: 'index', intersect: false } }, height);
}

// stacks: [{label, values: {step: v}, color}]
export function stackedBars(stepsList, stacks, { yTitle = '', height, percent = false } = {}) {
  const datasets = stacks.map((s, i) => ({
    label: s.label,
    data: stepsList.map((st) => (s.values[st] ?? 0)),
    backgroundColor: s.color || PALETTE[i % PALETTE.length],
    stack: 'all',
  }));
  const y = { stacked: true, title: { display: !!yTitle, text: yTitle }, max: percent ? 1 : undefined };
  return make(
    'bar',
    stepsList,
    datasets,
    { scales: { x: { ...stepAxis, stacked: true }, y }, interaction: { mode: 'index', intersect: false } },
    height,
  );
}

export function bars(labels, values, { label = '', color = PALETTE[0], height, xTitle = '' } = {}) {
  const datasets = [{ label, data: values, backgroundColor: color }];
  return make(
    'bar',
    labels,
    datasets,
    // Bars chart counts: whole-number ticks only (no "0.5 events").
    { scales: { x: { title: { display: !!xTitle, text: xTitle }, grid: { display: false } }, y: { beginAtZero: true, ticks: { precision: 0 } } }, plugins: { legend: { display: false } } },
    height,
  );
}
