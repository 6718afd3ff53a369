// Talking to the server. Beyond loopback the server needs a token: it arrives once in
// the address (?token=...), is kept in this browser's storage and removed from the
// address bar; requests send it as a header, and EventSource, images and downloads
// (which cannot send headers) as ?token=.
const KEY = "aitk-token";
const params = new URLSearchParams(window.location.search);
if (params.has("token")) {
  localStorage.setItem(KEY, params.get("token"));
  params.delete("token");
  const rest = params.toString();
  window.history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : ""));
}
const token = () => localStorage.getItem(KEY);
const withToken = (url) => (token() ? `${url}${url.includes("?") ? "&" : "?"}token=${encodeURIComponent(token())}` : url);

export async function api(method, url, body) {
  const headers = {};
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const raw = body instanceof Blob;  // an upload goes as it is
  if (body !== undefined && !raw) headers["Content-Type"] = "application/json";
  const response = await fetch(url, { method, headers,
    body: body === undefined ? undefined : raw ? body : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const err = new Error(data.error || `${response.status} ${response.statusText}`);
    err.errors = data.errors;
    throw err;
  }
  return data;
}

export const fileUrl = (jobId, path, download = false) =>
  withToken(`/api/jobs/${jobId}/files/${path.split("/").map(encodeURIComponent).join("/")}` +
    (download ? "?download=1" : ""));
export const eventsUrl = () => withToken("/api/events");
