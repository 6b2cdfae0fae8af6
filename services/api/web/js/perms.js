// What the logged-in user may do, read from /api/v1/permissions/summary. Pages offer only the
// controls it allows; the API decides again on every action, and a page shows its refusal.
import { get } from "./api.js";

/** What a user may do to an experiment, task or model of their own whatever their roles (the
 * server's OWNER_PERMISSIONS in events/domain/authorization.py). */
const OWNER_PERMISSIONS = new Set(["view_experiment", "update_experiment", "delete_experiment",
  "view_nsc", "update_nsc", "edit_model_registry", "delete_model_registry", "view_model_registry"]);

/** The caller's permissions: cluster-wide, and per workspace (by name) they may see. */
export class Permissions {
  constructor(summary) {
    this.summary = summary;
    this.byWorkspace = new Map(Object.entries(summary.workspaces || {}).map(([w, ps]) => [w, new Set(ps)]));
    this.clusterWide = new Set(summary.cluster || []);
  }

  get username() { return this.summary.username; }
  get admin() { return !!this.summary.admin; }

  /** Whether the caller holds `permission` cluster-wide (e.g. create_workspace, update_group). */
  cluster(permission) { return this.admin || this.clusterWide.has(permission); }

  /** Whether the caller may act with `permission` in workspace `workspace` (its name) on an
   * object of `owner` (omit for workspace-level actions). */
  in(workspace, permission, owner) {
    if (this.admin) return true;
    if (owner !== undefined && owner === this.username && OWNER_PERMISSIONS.has(permission)) return true;
    return !!this.byWorkspace.get(workspace)?.has(permission);
  }

  /** The names of the workspaces where the caller holds `permission`. */
  workspacesWith(permission) {
    return [...this.byWorkspace].filter(([, ps]) => this.admin || ps.has(permission)).map(([w]) => w);
  }
}

/** Reads the caller's permissions afresh (a grant or a rename since the last page shows). */
export async function permissions() {
  return new Permissions(await get("/permissions/summary"));
}
