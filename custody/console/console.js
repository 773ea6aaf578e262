// The operator console (custody.api.console_routes serves it; no build step, no other host).
// Sign-in and every approval are WebAuthn: the page never holds an API key or a password. The
// session cookie is HttpOnly (this script cannot read it); state changes carry the session's CSRF
// token. Every action is checked again by the service (role, maker-checker, signatures) and by
// the signer (approvals), so a button hidden here is a convenience, never the control.
"use strict";

const $ = (id) => document.getElementById(id);
let me = null; // {username, role, csrf_token, key_id, ...} of the signed-in session
const rowNotes = {}; // "<kind>:<id>" -> {error|ok: text}, shown next to the row until the next action on it
let auditBefore = null;

// ---- small helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(headers, rows) {
  if (!rows.length) return el("p", {class: "muted"}, "Nothing here.");
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

function b64urlToBytes(s) {
  const b64 = s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4);
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}
function bytesToB64(buf) {
  let s = "";
  for (const b of new Uint8Array(buf)) s += String.fromCharCode(b);
  return btoa(s);
}
function bytesToB64url(buf) {
  return bytesToB64(buf).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function ago(seconds) {
  const s = Math.abs(seconds);
  const text = s < 90 ? `${s}s` : s < 5400 ? `${Math.round(s / 60)}m` : s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
  return text;
}

function unitsOf(minor, decimals) {
  const negative = minor.startsWith("-");
  const digits = (negative ? minor.slice(1) : minor).padStart(decimals + 1, "0");
  const whole = digits.slice(0, digits.length - decimals);
  const frac = decimals ? "." + digits.slice(digits.length - decimals) : "";
  return (negative ? "-" : "") + whole + frac;
}

class ApiFailure extends Error {
  constructor(status, code, message) { super(`${code}: ${message}`); this.status = status; this.code = code; }
}

async function call(method, path, body) {
  const headers = {"Accept": "application/json"};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && me) headers["X-CSRF-Token"] = me.csrf_token;
  const r = await fetch(path, {method, headers, credentials: "same-origin", body: body === undefined ? undefined : JSON.stringify(body)});
  const data = await r.json().catch(() => ({}));
  if (!r.ok) {
    const err = data.error || {code: `http_${r.status}`, message: r.statusText};
    if (r.status === 401 && me) signedOut(`Your session ended (${err.message}). Sign in again.`);
    throw new ApiFailure(r.status, err.code, err.message);
  }
  return data;
}

function note(key, cell) {
  const n = rowNotes[key];
  if (!n) return null;
  return el("span", {class: n.error ? "row-error" : "row-ok", "data-testid": `note-${key}`}, n.error || n.ok);
}

async function act(key, fn, okText, rerender) {
  delete rowNotes[key];
  try {
    await fn();
    if (okText) rowNotes[key] = {ok: okText};
  } catch (e) {
    if (e instanceof ApiFailure && e.status === 401) return;
    rowNotes[key] = {error: e.message || String(e)};
  }
  await rerender();
}

// ---- the confirmation dialog ------------------------------------------------------------------

function ask({title, facts = [], payload = null, inputName = null, okText = "OK", danger = false}) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("confirm-payload").textContent = payload || "";
  $("confirm-payload").parentElement.classList.toggle("hidden", !payload);
  $("confirm-input-label").classList.toggle("hidden", !inputName);
  $("confirm-input-name").textContent = inputName || "";
  $("confirm-input").value = "";
  $("confirm-error").textContent = "";
  $("confirm-ok").textContent = okText;
  $("confirm-ok").className = danger ? "danger" : "primary";
  return new Promise((resolve) => {
    const onClick = (event) => {
      if (inputName && !$("confirm-input").value.trim()) {
        event.preventDefault();
        $("confirm-error").textContent = `${inputName.replace(/ \(.*\)$/, "")} is required.`;
      }
    };
    $("confirm-ok").addEventListener("click", onClick);
    dialog.addEventListener("close", () => {
      $("confirm-ok").removeEventListener("click", onClick);
      resolve(dialog.returnValue === "ok" ? $("confirm-input").value.trim() || true : null);
    }, {once: true});
    dialog.returnValue = "";
    dialog.showModal();
    (inputName ? $("confirm-input") : $("confirm-cancel")).focus();
  });
}

// ---- sign-in and enrolment --------------------------------------------------------------------

function signedOut(message) {
  me = null;
  $("signin").classList.remove("hidden");
  for (const id of ["tabs", "content", "sign-out"]) $(id).classList.add("hidden");
  $("who").textContent = "";
  $("signin-message").className = "message";
  $("signin-message").textContent = message || "";
}

function signedIn(session) {
  me = session;
  $("signin").classList.add("hidden");
  for (const id of ["tabs", "content", "sign-out"]) $(id).classList.remove("hidden");
  $("who").textContent = `Signed in as ${me.username} (${me.role})`;
  document.body.dataset.role = me.role;
  for (const node of document.querySelectorAll(".admin-only")) node.classList.toggle("hidden", me.role !== "admin");
  for (const node of document.querySelectorAll(".operator-only")) node.classList.toggle("hidden", me.role !== "operator");
  showTab("queue");
}

async function enrol() {
  const username = $("username").value.trim();
  $("signin-message").textContent = "";
  try {
    const options = await call("POST", "/console/enrol/options", {username});
    const publicKey = {...options, challenge: b64urlToBytes(options.challenge),
                       user: {...options.user, id: b64urlToBytes(options.user.id)},
                       excludeCredentials: (options.excludeCredentials || []).map((c) => ({...c, id: b64urlToBytes(c.id)}))};
    const cred = await navigator.credentials.create({publicKey});
    const response = {id: cred.id, rawId: bytesToB64url(cred.rawId), type: cred.type,
                      response: {clientDataJSON: bytesToB64url(cred.response.clientDataJSON),
                                 attestationObject: bytesToB64url(cred.response.attestationObject),
                                 transports: cred.response.getTransports ? cred.response.getTransports() : []},
                      clientExtensionResults: cred.getClientExtensionResults()};
    const enrolled = await call("POST", "/console/enrol", {credential: response});
    $("signin-message").className = "message ok";
    $("signin-message").textContent = `Key enrolled for ${enrolled.username}, waiting for an admin. Read them its fingerprint: ${enrolled.fingerprint}`;
  } catch (e) {
    $("signin-message").textContent = `Enrolment failed: ${e.message || e}`;
  }
}

async function signIn() {
  const username = $("username").value.trim();
  $("signin-message").textContent = "";
  try {
    const options = await call("POST", "/console/sign-in/options", {username});
    if (!options.allowCredentials || !options.allowCredentials.length) {
      $("signin-message").textContent = "No approved key for this username (enrol one, and have an admin approve it).";
      return;
    }
    const publicKey = {...options, challenge: b64urlToBytes(options.challenge),
                       allowCredentials: options.allowCredentials.map((c) => ({...c, id: b64urlToBytes(c.id)}))};
    const cred = await navigator.credentials.get({publicKey});
    const session = await call("POST", "/console/sign-in", {credential: {
      id: cred.id, rawId: bytesToB64url(cred.rawId), type: cred.type,
      response: {clientDataJSON: bytesToB64url(cred.response.clientDataJSON),
                 authenticatorData: bytesToB64url(cred.response.authenticatorData),
                 signature: bytesToB64url(cred.response.signature),
                 userHandle: cred.response.userHandle ? bytesToB64url(cred.response.userHandle) : null},
      clientExtensionResults: cred.getClientExtensionResults()}});
    signedIn(session);
  } catch (e) {
    $("signin-message").textContent = `Sign-in failed: ${e.message || e}`;
  }
}

async function signOut() {
  try { await call("POST", "/console/sign-out"); } catch (e) { /* the session may be gone already */ }
  signedOut("Signed out.");
}

// ---- tabs ---------------------------------------------------------------------------------------

const RENDER = {queue: renderQueue, audit: () => renderAudit(true), incidents: renderIncidents, kill: renderKill,
                deposits: renderDeposits, adjustments: renderAdjustments, balances: renderBalances,
                reconciliation: renderReconciliation, payouts: renderPayouts, enrolments: renderEnrolments};

async function showTab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === name);
  for (const s of document.querySelectorAll(".tab")) s.classList.toggle("hidden", s.id !== `tab-${name}`);
  try { await RENDER[name](); } catch (e) { if (!(e instanceof ApiFailure && e.status === 401)) $(`tab-${name}`).append(el("p", {class: "message"}, e.message)); }
}

// ---- approvals ----------------------------------------------------------------------------------

const canDecide = () => me && me.role === "operator"; // approving a payment is an operator's alone (not admin)
const canOperate = () => me && (me.role === "operator" || me.role === "admin");

async function renderQueue() {
  const rows = await call("GET", "/console/api/queue");
  const body = rows.map((w) => {
    const key = `w:${w.id}`;
    const actions = [];
    if (w.mine) actions.push(el("span", {class: "tag mine"}, "your request: not yours to approve"));
    else if (w.acted) actions.push(el("span", {class: "tag"}, "you decided on this"));
    else if (canDecide()) {
      actions.push(el("button", {class: "primary", "data-action": "approve", onclick: () => approve(w)}, "Approve"), " ",
                   el("button", {class: "danger", "data-action": "reject", onclick: () => reject(w)}, "Reject"));
    }
    const expiry = w.expires_in_seconds === null ? "" : w.expires_in_seconds > 0 ? `in ${ago(w.expires_in_seconds)}` : "expired";
    return el("tr", {"data-withdrawal": w.id},
      el("td", {}, `#${w.id}`),
      el("td", {}, w.requested_by),
      el("td", {}, w.customer, el("div", {class: "muted"}, `account ${w.account_id}`)),
      el("td", {class: "num big"}, `${w.amount} ${w.asset}`),
      el("td", {class: "mono"}, w.destination,
         el("div", {}, el("span", {class: w.allowlist === "allowlisted" ? "tag ok" : "tag warn"}, w.allowlist)),
         el("div", {class: "muted"}, w.destination_seen_before ? `first seen ${w.destination_first_seen} (${w.destination_seen_before} earlier)` : "first time seen")),
      el("td", {}, w.policy_reasons.map((r) => el("div", {class: "tag warn"}, r))),
      el("td", {"data-testid": `progress-${w.id}`}, `${w.approvals.length} of ${w.required_approvals}`,
         el("div", {class: "muted"}, w.approvals.length ? `by ${w.approvals.join(", ")}` : "no approval yet")),
      el("td", {}, ago(w.age_seconds)),
      el("td", {title: w.expires_at || ""}, expiry),
      el("td", {"data-testid": `actions-${w.id}`}, actions, note(key)));
  });
  const shown = new Set(rows.map((w) => `w:${w.id}`));
  const left = Object.keys(rowNotes).filter((k) => k.startsWith("w:") && !shown.has(k))  // decided rows leave the queue
    .map((k) => el("p", {}, `Withdrawal #${k.slice(2)}: `, note(k)));
  $("queue").replaceChildren(table(["", "Requested by", "Customer", "Amount", "Destination", "Policy reasons",
                                    "Approvals", "Age", "Expires", ""], body), ...left);
}

function decimalsOf(units) { return units.includes(".") ? units.split(".")[1].length : 0; }

// An assertion of the signed-in person's own key over `bytes` (challenge: their SHA-256), as the
// `signature` object the service takes (signer.approvals, scheme webauthn).
async function signWithMyKey(bytes) {
  const challenge = await crypto.subtle.digest("SHA-256", bytes);
  const credentialId = b64urlToBytes(me.key_id.slice("console:".length));
  const cred = await navigator.credentials.get({publicKey: {
    challenge, allowCredentials: [{type: "public-key", id: credentialId}], userVerification: "required", timeout: 120000}});
  return {key_id: me.key_id, scheme: "webauthn", signature: bytesToB64(cred.response.signature),
          authenticator_data: bytesToB64(cred.response.authenticatorData),
          client_data_json: bytesToB64(cred.response.clientDataJSON)};
}

async function approve(w) {
  await act(`w:${w.id}`, async () => {
    const shown = await call("GET", `/v1/withdrawals/${w.id}/approval-payload`);
    const bytes = Uint8Array.from(atob(shown.payload_base64), (c) => c.charCodeAt(0));
    const text = new TextDecoder("utf-8", {fatal: true}).decode(bytes);
    const p = JSON.parse(text); // what is shown below is read from the bytes the key signs, not from other fields
    if (p.withdrawal_id !== w.id || p.amount !== w.amount_minor || p.destination !== w.destination || p.asset !== w.asset) {
      throw new Error("the approval payload does not match this row: not signing");
    }
    const amount = `${unitsOf(p.amount, decimalsOf(w.amount))} ${p.asset}`;
    const comment = await ask({
      title: `Approve withdrawal #${p.withdrawal_id}`, okText: "Sign with your key and approve",
      inputName: "Comment for the audit log (required)", payload: text,
      facts: [["Asset", `${p.asset} on ${p.chain}`], ["Amount", amount], ["Destination", p.destination],
              ["Allowlist", w.allowlist + (w.allowlisted_at ? ` since ${w.allowlisted_at}` : "")],
              ["Destination first seen", w.destination_seen_before ? `${w.destination_first_seen} (${w.destination_seen_before} earlier withdrawals)` : "now: no earlier withdrawal named it"],
              ["Requested by", w.requested_by], ["Customer", w.customer],
              ["Policy reasons", w.policy_reasons.join(", ") || "none"],
              ["Approvals so far", `${w.approvals.length} of ${w.required_approvals}${w.approvals.length ? ": " + w.approvals.join(", ") : ""}`],
              ["Decision expires", p.expires_at]]});
    if (comment === null) throw new Error("cancelled: nothing was signed");
    const r = await call("POST", `/v1/withdrawals/${w.id}/approve`, {comment, signature: await signWithMyKey(bytes)});
    rowNotes[`w:${w.id}`] = {ok: `approved: the withdrawal is ${r.state}`};
  }, null, renderQueue);
}

async function reject(w) {
  await act(`w:${w.id}`, async () => {
    const reason = await ask({title: `Reject withdrawal #${w.id}`, okText: "Reject", danger: true,
                              inputName: "Reason (required)",
                              facts: [["Amount", `${w.amount} ${w.asset}`], ["Destination", w.destination], ["Requested by", w.requested_by]]});
    if (reason === null) throw new Error("cancelled: nothing was rejected");
    await call("POST", `/v1/withdrawals/${w.id}/reject`, {comment: reason});
  }, "rejected", renderQueue);
}

// ---- audit trail ----------------------------------------------------------------------------------

let auditSeq = 0; // a newer search wins over an older answer arriving late

async function renderAudit(fresh) {
  const seq = ++auditSeq;
  if (fresh) auditBefore = null;
  const q = $("audit-q").value.trim();
  const params = new URLSearchParams({limit: "50"});
  if (q) params.set("q", q);
  if (auditBefore) params.set("before", auditBefore);
  const page = await call("GET", `/console/api/audit?${params}`);
  if (seq !== auditSeq) return;
  const rows = page.events.map((e) => el("tr", {},
    el("td", {}, e.at), el("td", {}, e.actor), el("td", {}, e.action), el("td", {class: "mono"}, e.subject),
    el("td", {}, e.comment || ""), el("td", {}, el("details", {}, el("summary", {}, "detail"), el("pre", {}, JSON.stringify(e.detail, null, 1))))));
  const t = table(["When", "Who", "Did", "To what", "Comment", ""], rows);
  if (fresh) $("audit").replaceChildren(t); else $("audit").append(t);
  auditBefore = page.next_before;
  $("audit-more").classList.toggle("hidden", !auditBefore);
}

// ---- incidents ------------------------------------------------------------------------------------

async function renderIncidents() {
  const [incidents, acks] = await Promise.all([call("GET", "/v1/incidents"),
                                               call("GET", "/console/api/audit?q=incident.acknowledge&limit=200")]);
  const acked = {};
  for (const a of acks.events) if (a.action === "incident.acknowledge" && !acked[a.subject]) acked[a.subject] = a;
  const rows = incidents.map((i) => {
    const key = `i:${i.id}`;
    const ack = acked[`incident:${i.id}`];
    const actions = [];
    if (canOperate()) actions.push(el("button", {onclick: () => incidentNote(i, "ack")}, "Acknowledge"), " ");
    if (canDecide()) actions.push(el("button", {onclick: () => incidentNote(i, "resolve")}, "Resolve"));
    return el("tr", {"data-incident": i.id}, el("td", {}, `#${i.id}`), el("td", {}, i.kind),
      el("td", {}, el("span", {class: i.severity === "critical" ? "tag warn" : "tag"}, i.severity)), el("td", {}, i.opened_at),
      el("td", {}, ack ? `${ack.actor}: ${ack.comment || ""}` : el("span", {class: "muted"}, "not acknowledged")),
      el("td", {}, el("details", {}, el("summary", {}, "detail"), el("pre", {}, JSON.stringify(i.detail, null, 1)))),
      el("td", {}, actions, note(key)));
  });
  $("incidents").replaceChildren(table(["", "Kind", "Severity", "Opened", "Acknowledged", "", ""], rows));
}

async function incidentNote(i, what) {
  await act(`i:${i.id}`, async () => {
    const text = await ask({title: `${what === "ack" ? "Acknowledge" : "Resolve"} incident #${i.id} (${i.kind})`,
                            inputName: "Note (required)", okText: what === "ack" ? "Acknowledge" : "Resolve"});
    if (text === null) throw new Error("cancelled");
    if (what === "ack") await call("POST", `/console/api/incidents/${i.id}/ack`, {note: text});
    else await call("POST", `/v1/incidents/${i.id}/resolve`, {comment: text});
  }, what === "ack" ? "acknowledged" : "resolved", renderIncidents);
}

// ---- kill switch ----------------------------------------------------------------------------------

async function renderKill() {
  const ks = await call("GET", "/console/api/kill-switch");
  const actions = [];
  if (!ks.engaged && canOperate()) actions.push(el("button", {class: "danger", id: "engage", onclick: engage}, "Engage the kill switch"));
  if (ks.engaged && me.role === "admin") actions.push(el("button", {id: "release", onclick: release}, "Release the kill switch"));
  $("kill").replaceChildren(el("div", {},
    el("p", {class: "big", "data-testid": "kill-state"}, ks.engaged ? "ENGAGED: withdrawals are halted" : "Off: withdrawals flow"),
    ks.reason ? el("p", {}, `Reason: ${ks.reason} (by ${ks.changed_by})`) : null,
    el("h2", {}, "Backlog waiting behind it (drains when released)"),
    table(["Asset", "State", "Withdrawals", "Total"], ks.backlog.map((b) => el("tr", {},
      el("td", {}, b.asset), el("td", {}, b.state), el("td", {class: "num"}, b.count), el("td", {class: "num"}, `${b.total} ${b.asset}`)))),
    el("div", {class: "buttons"}, actions), note("kill")));
}

async function engage() {
  await act("kill", async () => {
    const reason = await ask({title: "Engage the kill switch", danger: true, okText: "Engage",
                              facts: [["Effect", "No withdrawal is accepted, batched or signed until an admin releases it"]],
                              inputName: "Reason (required)"});
    if (reason === null) throw new Error("cancelled: the kill switch was not engaged");
    await call("POST", "/v1/kill-switch", {engaged: true, reason});
  }, "engaged", renderKill);
}

async function release() {
  await act("kill", async () => {
    const reason = await ask({title: "Release the kill switch", okText: "Release", inputName: "Reason (required)"});
    if (reason === null) throw new Error("cancelled: the kill switch stays engaged");
    await call("POST", "/v1/kill-switch", {engaged: false, reason});
  }, "released", renderKill);
}

// ---- quarantined deposits -----------------------------------------------------------------------

async function renderDeposits() {
  const rows = await call("GET", "/console/api/quarantine");
  const header = ["", "Chain", "Amount", "From", "Transaction", "Screening", "Return", ""];
  const row = (d) => {
    const actions = d.state === "quarantined" && !d.return_withdrawal_id && canDecide() ?
      [el("button", {onclick: () => depositAction(d, "release")}, "Release to customer"), " ",
       el("button", {onclick: () => depositAction(d, "return")}, "Return to sender")] : [];
    return el("tr", {"data-deposit": d.id}, el("td", {}, `#${d.id}`), el("td", {}, d.chain),
      el("td", {class: "num"}, `${d.amount} ${d.asset}`), el("td", {class: "mono"}, d.senders.join(", ") || "unknown"),
      el("td", {class: "mono"}, `${d.txid}:${d.output_index}`),
      el("td", {}, d.screening ? el("details", {}, el("summary", {}, "verdict"), el("pre", {}, JSON.stringify(d.screening, null, 1))) : ""),
      el("td", {}, d.return_withdrawal_id ? `withdrawal #${d.return_withdrawal_id} (${d.return_state}) to ${d.return_destination}` : ""),
      el("td", {}, actions, note(`d:${d.id}`)));
  };
  $("deposits").replaceChildren(
    table(header, rows.filter((d) => d.state === "quarantined" && !d.return_withdrawal_id).map(row)),
    el("h2", {}, "Returns (each waits in the approval queue for operators other than its requester)"),
    table(header, rows.filter((d) => d.return_withdrawal_id).map(row)));
}

async function depositAction(d, what) {
  await act(`d:${d.id}`, async () => {
    const comment = await ask({title: `${what === "release" ? "Release" : "Return"} deposit #${d.id}`, inputName: "Comment (required)",
                               okText: what === "release" ? "Release" : "Request the return (other operators approve it)",
                               facts: [["Amount", `${d.amount} ${d.asset}`], ["From", d.senders.join(", ") || "unknown"]]});
    if (comment === null) throw new Error("cancelled");
    await call("POST", `/v1/deposits/${d.id}/${what}`, {comment});
  }, what === "release" ? "released" : "return requested: it waits in the approval queue", renderDeposits);
}

// ---- treasury adjustments -------------------------------------------------------------------------

async function renderAdjustments() {
  const rows = await call("GET", "/v1/treasury/adjustments");
  $("adjustments").replaceChildren(table(["", "State", "Proposed by", "Reason", "Transfers", "Approvals", ""], rows.map((a) => {
    const own = me.username && a.proposed_by === `api:${me.username}`;
    const open = a.state === "proposed" || a.state === "approved";
    const actions = !open ? [] : own && a.state === "proposed" ? [el("span", {class: "tag mine"}, "your proposal")] : !canDecide() ? [] :
      a.state === "approved" ? [el("span", {class: "tag"}, "the worker posts it next"), " ",
                                el("button", {class: "danger", onclick: () => adjustmentDecision(a, "reject")}, "Reject")] :
      [el("button", {onclick: () => adjustmentDecision(a, "approve")}, "Approve"), " ",
       el("button", {class: "danger", onclick: () => adjustmentDecision(a, "reject")}, "Reject")];
    return el("tr", {"data-adjustment": a.id}, el("td", {}, `#${a.id}`), el("td", {}, a.state), el("td", {}, a.proposed_by),
      el("td", {}, a.reason), el("td", {}, a.transfers.map((t) => el("div", {}, `${t.amount.value}: account ${t.debit_account_id} -> ${t.credit_account_id}`))),
      el("td", {}, `${a.approved_by.length} of ${a.quorum}${a.approved_by.length ? ": " + a.approved_by.join(", ") : ""}`),
      el("td", {}, actions, note(`a:${a.id}`)));
  })));
}

async function adjustmentDecision(a, what) {
  if (what === "approve") return approveAdjustment(a);
  await act(`a:${a.id}`, async () => {
    const comment = await ask({title: `Reject adjustment #${a.id}`, inputName: "Comment (required)",
                               okText: "Reject", danger: true, facts: [["Reason", a.reason]]});
    if (comment === null) throw new Error("cancelled");
    await call("POST", `/v1/treasury/adjustments/${a.id}/reject`, {comment});
  }, "rejected", renderAdjustments);
}

// Approving is signing the adjustment's payload (id, legs, reason, quorum, proposer) with the
// signed-in person's own key, as for a withdrawal; the worker posts it once the quorum is signed.
async function approveAdjustment(a) {
  await act(`a:${a.id}`, async () => {
    const shown = await call("GET", `/v1/treasury/adjustments/${a.id}/approval-payload`);
    const bytes = Uint8Array.from(atob(shown.payload_base64), (c) => c.charCodeAt(0));
    const text = new TextDecoder("utf-8", {fatal: true}).decode(bytes);
    const p = JSON.parse(text); // what is shown below is read from the bytes the key signs, not from other fields
    const same = p.adjustment_id === a.id && p.reason === a.reason && p.proposed_by === a.proposed_by &&
      p.legs.length === a.transfers.length && p.legs.every((l, i) => l.debit_account_id === a.transfers[i].debit_account_id &&
        l.credit_account_id === a.transfers[i].credit_account_id && l.amount === a.transfers[i].amount.minor);
    if (!same) throw new Error("the approval payload does not match this row: not signing");
    const comment = await ask({
      title: `Approve adjustment #${p.adjustment_id}`, okText: "Sign with your key and approve",
      inputName: "Comment for the audit log (required)", payload: text,
      facts: [["Reason", p.reason], ["Proposed by", p.proposed_by],
              ["Legs", p.legs.map((l, i) => `${a.transfers[i].amount.value} (${l.amount} minor units): account ${l.debit_account_id} -> ${l.credit_account_id}`).join("; ")],
              ["Approvals needed", `${p.quorum}`]]});
    if (comment === null) throw new Error("cancelled: nothing was signed");
    const r = await call("POST", `/v1/treasury/adjustments/${a.id}/approve`, {comment, signature: await signWithMyKey(bytes)});
    rowNotes[`a:${a.id}`] = {ok: r.state === "approved" ? "approved: the worker posts it next" : `approved: it is ${r.state}`};
  }, null, renderAdjustments);
}

async function propose(event) {
  event.preventDefault();
  const f = event.target;
  $("propose-error").textContent = "";
  try {
    await call("POST", "/v1/treasury/adjustments", {idempotency_key: crypto.randomUUID(), reason: f.reason.value,
      transfers: [{debit_account_id: Number(f.debit.value), credit_account_id: Number(f.credit.value), amount: f.amount.value}]});
    f.reset();
    await renderAdjustments();
  } catch (e) {
    $("propose-error").textContent = e.message;
  }
}

// ---- books -------------------------------------------------------------------------------------

async function renderBalances() {
  const rows = await call("GET", "/console/api/balances");
  $("balances").replaceChildren(table(["Chain", "Tier", "Asset", "Books (posted)", "Held"], rows.map((b) => el("tr", {},
    el("td", {}, b.chain), el("td", {}, b.tier), el("td", {}, b.asset), el("td", {class: "num"}, `${b.posted} ${b.asset}`),
    el("td", {class: "num"}, `${b.held} ${b.asset}`)))));
}

async function renderReconciliation() {
  const [rows, verify] = await Promise.all([call("GET", "/console/api/reconciliation"), call("GET", "/v1/verify")]);
  const run = canOperate() ? el("button", {id: "run-reconciliation", onclick: runReconciliation}, "Run a reconciliation pass") : null;
  $("reconciliation").replaceChildren(el("div", {},
    el("p", {"data-testid": "ledger-verify"}, verify.ok ? "Ledger self-check: every balance equals its journal" :
       `Ledger self-check FAILED: ${JSON.stringify(verify)}`), el("div", {class: "buttons"}, run, note("recon"))), table(["Chain", "Tier", "Asset", "Difference", "Booked off chain", "Height", "Updated", "History"],
    rows.map((l) => el("tr", {}, el("td", {}, l.chain), el("td", {}, l.tier), el("td", {}, l.asset),
      el("td", {class: "num"}, el("span", {class: l.difference_minor === "0" ? "tag ok" : "tag warn"}, `${l.difference} ${l.asset}`)),
      el("td", {class: "num"}, `${l.booked_off_chain} ${l.asset}`), el("td", {class: "num"}, l.height), el("td", {}, l.updated_at),
      el("td", {}, l.history.length ? el("details", {}, el("summary", {}, `${l.history.length} events`),
        l.history.map((h) => el("div", {class: "muted"}, `${h.at} at height ${h.height}: ${h.difference} ${l.asset} ` +
          `(before: ${h.previous_difference ?? "none"}), ${h.severity}, ` +
          (h.resolved_at ? `resolved by ${h.resolved_by}` : `incident #${h.incident_id} open`)))) : "none")))));
}

async function runReconciliation() {
  await act("recon", () => call("POST", "/v1/reconciliation"), "pass done", renderReconciliation);
}

async function renderPayouts() {
  const p = await call("GET", "/console/api/payouts");
  const tx = (ids) => ids.map((t) => el("div", {class: "mono"}, el("a", {href: `#tx-${t}`, id: `tx-${t}`}, t)));
  const batchTxs = (b) => b.transactions.map((t) => el("div", {class: "mono", id: `tx-${t.txid}`},
    el("a", {href: `#tx-${t.txid}`}, t.txid), ` ${t.state}, ${t.confirmations} conf.` +
    (t.block_height ? ` at ${t.block_height}` : "") + `, fee ${t.fee} ${b.asset}` + (t.replacement ? " (replacement)" : "")));
  const paid = (b) => b.withdrawals.length ? el("details", {}, el("summary", {}, `${b.withdrawals.length} withdrawals`),
    b.withdrawals.map((w) => el("div", {class: "muted"}, `#${w.id}: ${w.amount} ${b.asset} to ${w.destination} (${w.state})`))) : "";
  $("batches").replaceChildren(table(["", "Chain", "State", "Outputs", "Total", "Transactions", "Pays", "Created"], p.batches.map((b) => el("tr", {"data-batch": b.id},
    el("td", {}, `#${b.id}`), el("td", {}, b.chain), el("td", {}, b.state), el("td", {class: "num"}, b.outputs),
    el("td", {class: "num"}, `${b.total} ${b.asset}`), el("td", {}, batchTxs(b)), el("td", {}, paid(b)), el("td", {}, b.created_at)))));
  $("sweeps").replaceChildren(table(["", "Chain", "State", "Amount", "Transaction", "Created"], p.sweeps.map((s) => el("tr", {},
    el("td", {}, `#${s.id}`), el("td", {}, s.chain), el("td", {}, s.state), el("td", {class: "num"}, `${s.amount} ${s.asset}`),
    el("td", {}, tx(s.txids)), el("td", {}, s.created_at)))));
  $("rebalances").replaceChildren(table(["", "Chain", "From", "To", "State", "Amount", "Transaction"], p.rebalances.map((r) => el("tr", {},
    el("td", {}, `#${r.id}`), el("td", {}, r.chain), el("td", {}, r.from), el("td", {}, r.to), el("td", {}, r.state),
    el("td", {class: "num"}, `${r.amount} ${r.asset}`), el("td", {}, tx(r.txids))))));
}

// ---- enrolments (admins) ------------------------------------------------------------------------

async function renderEnrolments() {
  const rows = await call("GET", "/console/api/credentials");
  $("enrolments").replaceChildren(table(["", "User", "State", "Role", "Fingerprint", "Requested", "Decided by", ""], rows.map((k) => {
    const role = el("select", {"aria-label": "role"}, ["operator", "auditor", "admin"].map((r) => el("option", {value: r}, r)));
    const actions = [];
    const known = rows.some((o) => o.id !== k.id && o.username === k.username && o.state === "active");
    if (k.state === "pending" && known) actions.push(el("span", {class: "tag warn"}, "this user already has an active key: confirm with them"), " ");
    if (k.state === "pending") actions.push(role, " ", el("button", {class: "primary", onclick: () => credentialAction(k, "approve", role.value)}, "Approve"), " ");
    if (k.state === "active" && k.role === "operator") actions.push(el("button", {onclick: () => showEntry(k)}, "Approver entry"), " ");
    if (k.state === "active" && k.role === "admin") actions.push(el("button", {onclick: () => showEntry(k)}, "Admin entry"), " ");
    if (k.state !== "revoked") actions.push(el("button", {class: "danger", onclick: () => credentialAction(k, "revoke")}, "Revoke"));
    return el("tr", {"data-credential": k.id}, el("td", {}, `#${k.id}`), el("td", {}, k.username), el("td", {}, k.state),
      el("td", {}, k.role || ""), el("td", {class: "mono"}, k.fingerprint), el("td", {}, k.requested_at), el("td", {}, k.decided_by || ""),
      el("td", {}, actions, note(`k:${k.id}`)));
  })));
}

async function credentialAction(k, what, role) {
  await act(`k:${k.id}`, async () => {
    const ok = await ask({title: `${what === "approve" ? `Approve ${k.username} as ${role}` : `Revoke ${k.username}'s key`}`,
                          facts: [["Fingerprint", k.fingerprint], ["Requested", k.requested_at]], okText: what === "approve" ? "Approve" : "Revoke",
                          danger: what !== "approve"});
    if (ok === null) throw new Error("cancelled");
    if (what !== "approve") {
      await call("POST", `/console/api/credentials/${k.id}/revoke`);
      return;
    }
    // Approving is signing: your key's assertion over the credential's activation payload, which
    // names its id, its key's hash (whose first 16 hex digits are the fingerprint you read out), user and role.
    const shown = await call("GET", `/console/api/credentials/${k.id}/activation-payload?role=${encodeURIComponent(role)}`);
    const bytes = Uint8Array.from(atob(shown.payload_base64), (c) => c.charCodeAt(0));
    const p = JSON.parse(new TextDecoder("utf-8", {fatal: true}).decode(bytes));
    const printed = p.public_key_sha256.slice(0, 16).match(/.{4}/g).join(" ");
    if (p.username !== k.username || p.role !== role || p.credential_id !== k.key_id.slice("console:".length) || printed !== k.fingerprint) {
      throw new Error("the activation payload does not match this row: not signing");
    }
    await call("POST", `/console/api/credentials/${k.id}/approve`, {role, activation: await signWithMyKey(bytes)});
  }, what === "approve" ? "approved" : "revoked", renderEnrolments);
}

async function showEntry(k) {
  const e = await call("GET", `/console/api/credentials/${k.id}/approver-entry`);
  const confirm = `# ${e.username}'s key, fingerprint ${e.fingerprint}: confirm it with them in person before adding it\n`;
  if (e.config === "CONSOLE_ADMINS") {
    $("approver-entry").textContent = confirm + "# a console admin (the root of trust): add to the JSON list CONSOLE_ADMINS\n" +
      JSON.stringify(e.entry);
    return;
  }
  $("approver-entry").textContent = confirm +
    `# activation signed by admin ${e.activated_by.operator} (key fingerprint ${e.activated_by.fingerprint})\n` +
    "# add to the signer's configuration (and custody's `approvers`)\n[[approvers]]\n" +
    Object.entries(e.entry).map(([key, value]) => `${key} = ${JSON.stringify(value)}`).join("\n");
}

// ---- start ----------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", async () => {
  $("do-sign-in").addEventListener("click", signIn);
  $("do-enrol").addEventListener("click", enrol);
  $("sign-out").addEventListener("click", signOut);
  $("audit-search").addEventListener("click", () => renderAudit(true));
  $("audit-more").addEventListener("click", () => renderAudit(false));
  $("propose").addEventListener("submit", propose);
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
  try {
    const r = await fetch("/console/session", {credentials: "same-origin"});
    if (r.ok) signedIn(await r.json()); else signedOut("");
  } catch (e) {
    signedOut("");
  }
});
