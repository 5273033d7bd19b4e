// The data layer: the backend's JSON API (live, with SSE), or the data a
// static export embedded as classic scripts (no fetch: it must open from file://).

const STATIC = window.HARNESSRL_STATIC || null;
export const isStatic = STATIC !== null;

export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function get(path, options = {}) {
  const resp = await fetch(path, { credentials: 'same-origin', ...options });
  let body = null;
  try {
    body = await resp.json();
  } catch {
    body = null;
  }
  if (!resp.ok) throw new HttpError(resp.status, (body && body.error) || `${resp.status} ${resp.statusText}`);
  return body;
}

const enc = encodeURIComponent;

export const api = {
  runs: () => (STATIC ? Promise.resolve({ runs: STATIC.runs }) : get('/api/runs')),
  run: (id) => (STATIC ? Promise.resolve(STATIC.overview) : get(`/api/runs/${enc(id)}`)),
  summary: (id) => (STATIC ? Promise.resolve(STATIC.summary) : get(`/api/runs/${enc(id)}/summary`)),
  trajectories: (id) =>
    STATIC ? Promise.resolve({ trajectories: STATIC.trajectories }) : get(`/api/runs/${enc(id)}/trajectories`),
  trajectory: (id, trial) => (STATIC ? loadStaticTrajectory(trial) : get(`/api/runs/${enc(id)}/trajectories/${enc(trial)}`)),
  compare: (ids) => get(`/api/compare?runs=${ids.map(enc).join(',')}`),
  analysis: (id) =>
    STATIC ? Promise.resolve({ enabled: false, candidates: STATIC.analysis || [] }) : get(`/api/runs/${enc(id)}/analysis`),
  analyse: (id) => get(`/api/runs/${enc(id)}/analysis`, { method: 'POST' }),
  verdict: (id, cid, verdict) =>
    get(`/api/runs/${enc(id)}/analysis/${enc(cid)}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ verdict }),
    }),
};

export function staticData() {
  return STATIC;
}

function loadStaticTrajectory(trial) {
  const file = STATIC.trajectory_files[trial];
  if (!file) return Promise.reject(new HttpError(404, `no trajectory ${trial} in this export`));
  window.HARNESSRL_TRAJ = window.HARNESSRL_TRAJ || {};
  if (window.HARNESSRL_TRAJ[trial]) return Promise.resolve(window.HARNESSRL_TRAJ[trial]);
  return new Promise((resolve, reject) => {
    const script = document.createElement('script');
    script.src = file;
    script.onload = () => resolve(window.HARNESSRL_TRAJ[trial]);
    script.onerror = () => reject(new HttpError(404, `cannot load ${file}`));
    document.head.appendChild(script);
  });
}

// Live updates: calls onUpdate(fingerprint) on every SSE "update" event.
export function subscribe(runId, onUpdate, onState) {
  if (STATIC || !window.EventSource) return () => {};
  const source = new EventSource(`/api/runs/${enc(runId)}/events`);
  source.addEventListener('update', (e) => onUpdate(JSON.parse(e.data)));
  source.onopen = () => onState(true);
  source.onerror = () => onState(false);
  return () => source.close();
}

export const links = {
  runs: () => (STATIC ? '#/' : '/'),
  run: (id) => (STATIC ? '#/' : `/runs/${enc(id)}`),
  trajectory: (id, trial) => (STATIC ? `#/trajectories/${enc(trial)}` : `/runs/${enc(id)}/trajectories/${enc(trial)}`),
  compare: (ids = []) => `/compare${ids.length ? `?runs=${ids.map(enc).join(',')}` : ''}`,
};
