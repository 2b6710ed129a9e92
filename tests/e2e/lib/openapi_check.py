"""openapi_check.py: checks real HTTP answers against docs/openapi.json, as a
third-party API validator (schemathesis and the like) would.

For each response handed to Spec.check():
  * the request's method and path must be an operation of the document (the
    path matched against the path templates, literal segments preferred, so
    /v1/reservations/availability is not /v1/reservations/{id});
  * its status must be documented for that operation: the exact code, else a
    range such as 4XX, else `default`;
  * every header the document marks required for that answer must be there;
  * whatever the document says, what HTTP asks of a status: WWW-Authenticate
    on a 401 (RFC 9110 15.5.2), Allow on a 405 (15.5.6), and, as this API
    promises, Retry-After with whole seconds on a 429 or 503;
  * if the answer documents content, the Content-Type (parameters dropped)
    must be one of its media types (wildcards such as text/* allowed), and a
    JSON body must validate against that media type's schema; if it
    documents none, the body must be empty;
  * a HEAD answer has no body to check; its status and headers are checked;
  * with strict_fields, also what a validator lets pass but a client
    generator would drop: a JSON field the schema does not name, in an
    object whose schema lists its properties and says nothing about others.

OpenAPI 3.0 schema objects are not JSON Schema, so the whole document is
converted once into a copy that is: `nullable: true` becomes "or null"
(an anyOf with {"type": "null"}, which also covers enum and $ref siblings),
the OpenAPI-only keywords (example, discriminator, xml, externalDocs,
deprecated, readOnly, writeOnly) are dropped, and $refs keep pointing into
the converted copy, which is the resolver's root document. Validation uses
Draft 4 (OpenAPI 3.0's exclusiveMinimum/Maximum are Draft 4's booleans) with
python3-jsonschema and its format checker.

Spec(path=None, collect=False, strict_fields=False)
                             loads docs/openapi.json (or path); with
                             collect, check() notes problems in .problems
                             instead of raising, so one run lists them all
  operations() -> {(METHOD, template)}      every operation documented
  match(method, path) -> (METHOD, template) or None
  check(resp, method=None, path=None) -> (METHOD, template)
                             raises AssertionError naming every problem;
                             records the operation and status as exercised
  exercised                  {(METHOD, template): {status, ...}}
  not_exercised() -> sorted [(METHOD, template)]
"""
import copy
import json
import os
import re
from urllib.parse import urlsplit

import jsonschema

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SPEC_PATH = os.path.join(REPO, "docs", "openapi.json")
METHODS = ("get", "head", "options", "post", "put", "patch", "delete", "trace")
# Keywords of the OpenAPI 3.0 schema object that JSON Schema does not have
# (or, for readOnly/writeOnly, that only say in which direction a field
# travels); removed before validating.
OPENAPI_ONLY = ("example", "discriminator", "xml", "externalDocs", "deprecated", "readOnly", "writeOnly")


def to_json_schema(schema):
    """A JSON Schema (Draft 4) equivalent of an OpenAPI 3.0 schema object."""
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in OPENAPI_ONLY or k == "nullable":
            continue
        if k == "properties" or k == "patternProperties" or k == "definitions":
            out[k] = {name: to_json_schema(s) for name, s in v.items()}
        elif k in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[k] = to_json_schema(v)
        else:
            out[k] = copy.deepcopy(v)
    if schema.get("nullable") is True:
        # {"type": "string", "enum": [...]} or a $ref with nullable: any of
        # them, or null. anyOf keeps the other keywords' meaning untouched.
        return {"anyOf": [{"type": "null"}, out]}
    return out


def _convert_document(doc):
    """The document with every schema object converted; other parts as they are."""
    doc = copy.deepcopy(doc)
    comps = doc.get("components", {})
    comps["schemas"] = {name: to_json_schema(s) for name, s in comps.get("schemas", {}).items()}
    for resp in comps.get("responses", {}).values():
        for media in resp.get("content", {}).values():
            if "schema" in media:
                media["schema"] = to_json_schema(media["schema"])
    for item in doc.get("paths", {}).values():
        for method in METHODS:
            op = item.get(method)
            if not op:
                continue
            for resp in op.get("responses", {}).values():
                for media in resp.get("content", {}).values():
                    if "schema" in media:
                        media["schema"] = to_json_schema(media["schema"])
    return doc


def _media_matches(pattern, actual):
    p_type, _, p_sub = pattern.partition("/")
    a_type, _, a_sub = actual.partition("/")
    return (p_type in ("*", a_type)) and (p_sub in ("*", a_sub))


def protocol_problems(resp):
    """What HTTP itself (and the API's promise on retries) asks of an
    answer's headers, whatever a document says."""
    out = []
    status, h = resp.status_code, resp.headers
    if status == 401 and not h.get("WWW-Authenticate"):
        out.append("a 401 without WWW-Authenticate (RFC 9110 15.5.2)")
    if status == 405 and "Allow" not in h:
        out.append("a 405 without Allow (RFC 9110 15.5.6)")
    if status in (429, 503) and not re.fullmatch(r"[0-9]+", h.get("Retry-After", "")):
        out.append(f"a {status} without Retry-After in seconds: {h.get('Retry-After')!r}")
    return out


class Spec:
    def __init__(self, path=None, collect=False, strict_fields=False):
        self.collect = collect
        self.strict_fields = strict_fields
        self.problems = []
        with open(path or SPEC_PATH) as f:
            self.raw = json.load(f)
        self.doc = _convert_document(self.raw)
        self.resolver = jsonschema.RefResolver.from_schema(self.doc)
        self.formats = jsonschema.draft4_format_checker
        self.exercised = {}
        # (template, regex, number of {params}) sorted so that the template
        # with the most literal segments wins: /x/availability before /x/{id}.
        self._templates = []
        for template in self.doc["paths"]:
            parts = template.strip("/").split("/") if template != "/" else []
            rx = "^/" + "/".join(r"[^/]+" if re.fullmatch(r"\{[^}]+\}", p) else re.escape(p) for p in parts) + "$"
            params = sum(1 for p in parts if p.startswith("{"))
            self._templates.append((params, template, re.compile(rx)))
        self._templates.sort(key=lambda t: (t[0], t[1]))

    # ------------------------------------------------------------ lookup

    def operations(self):
        return {(m.upper(), t) for t, item in self.doc["paths"].items() for m in METHODS if m in item}

    def match(self, method, path):
        """(METHOD, template) of the documented operation for a request, or
        None: the first template (fewest parameters) whose shape matches and
        that has the method."""
        path = urlsplit(path).path or "/"
        for _, template, rx in self._templates:
            if rx.match(path) and method.lower() in self.doc["paths"][template]:
                return method.upper(), template
        return None

    def _ref(self, obj):
        while isinstance(obj, dict) and "$ref" in obj:
            _, obj = self.resolver.resolve(obj["$ref"])
        return obj

    def response_spec(self, op_key, status):
        """The response object documented for status (exact, then nXX, then
        default) and the key it was found under, or (None, None)."""
        method, template = op_key
        responses = self.doc["paths"][template][method.lower()].get("responses", {})
        for key in (str(status), f"{str(status)[0]}XX", f"{str(status)[0]}xx", "default"):
            if key in responses:
                return self._ref(responses[key]), key
        return None, None

    # ------------------------------------------------------------ checking

    def check(self, resp, method=None, path=None):
        """Checks one requests.Response; returns its (METHOD, template)."""
        try:
            return self._check(resp, method, path)
        except AssertionError as e:
            if not self.collect:
                raise
            self.problems.append(str(e))
            return None

    def _check(self, resp, method, path):
        method = (method or resp.request.method).upper()
        path = path or urlsplit(resp.request.url).path
        what = f"{method} {path} -> {resp.status_code}"
        op = self.match(method, path)
        assert op is not None, f"{what}: no operation in docs/openapi.json for this method and path"
        problems = []
        rspec, key = self.response_spec(op, resp.status_code)
        if rspec is None:
            documented = sorted(self.doc["paths"][op[1]][op[0].lower()].get("responses", {}))
            raise AssertionError(f"{what}: status {resp.status_code} is not documented for {op[0]} {op[1]} "
                                 f"(documented: {documented}); body: {resp.text[:300]}")
        for name, h in rspec.get("headers", {}).items():
            h = self._ref(h)
            if h.get("required") and name not in resp.headers:
                problems.append(f"required header {name} missing")
        problems += protocol_problems(resp)
        content = rspec.get("content", {})
        body = resp.content
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if method != "HEAD":
            if not content:
                if body:
                    problems.append(f"the document gives response {key} no content, but the body is "
                                    f"{ctype or 'untyped'}: {body[:200]!r}")
            else:
                media = next((m for m in content if _media_matches(m.lower(), ctype)), None) if ctype else None
                if media is None:
                    problems.append(f"Content-Type {ctype or '(none)'!r} is not one of {sorted(content)} "
                                    f"documented for response {key}")
                elif "schema" in content[media] and (ctype == "application/json" or ctype.endswith("+json")):
                    try:
                        instance = json.loads(body)
                    except ValueError as e:
                        problems.append(f"body is not JSON ({e}): {body[:200]!r}")
                    else:
                        problems += self._validate(content[media]["schema"], instance)
                        # An error's code must be one its response lists
                        # (x-error-codes), where the response lists any.
                        codes = rspec.get("x-error-codes")
                        code = instance.get("error", {}).get("code") if isinstance(instance, dict) else None
                        if codes and isinstance(instance.get("error"), dict) and code not in codes:
                            problems.append(f"error code {code!r} is not among {codes} of response {key}")
        if problems:
            raise AssertionError(f"{what} ({op[0]} {op[1]}, response {key}):\n  " + "\n  ".join(problems)
                                 + f"\nbody: {resp.text[:1500]}")
        self.exercised.setdefault(op, set()).add(resp.status_code)
        return op

    def _validate(self, schema, instance):
        v = jsonschema.Draft4Validator(schema, resolver=self.resolver, format_checker=self.formats)
        out = []
        errors = list(v.iter_errors(instance))
        if not errors and self.strict_fields:
            out += [f"undocumented field {where}" for where in self._extra_fields(schema, instance, "")]
        for e in sorted(errors, key=lambda e: list(e.absolute_path)):
            where = "/".join(map(str, e.absolute_path)) or "(root)"
            # anyOf/oneOf errors say little; their closest sub-errors say why.
            detail = "; ".join(sorted({c.message[:200] for c in (e.context or [])}))[:600]
            out.append(f"schema: at {where}: {e.message[:300]}" + (f" [{detail}]" if detail else ""))
        return out

    def _extra_fields(self, schema, instance, where):
        """Paths of fields in instance (already valid) that schema does not name."""
        schema = self._ref(schema)
        if not isinstance(schema, dict):
            return []
        for key in ("anyOf", "oneOf"):
            if key in schema:
                for branch in schema[key]:
                    if jsonschema.Draft4Validator(branch, resolver=self.resolver).is_valid(instance):
                        return self._extra_fields(branch, instance, where)
                return []
        if isinstance(instance, list):
            items = schema.get("items")
            return [x for i, v in enumerate(instance) for x in self._extra_fields(items, v, f"{where}/{i}")] \
                if items else []
        if not isinstance(instance, dict):
            return []
        props, others, named = {}, None, False
        for part in [schema] + [self._ref(b) for b in schema.get("allOf", [])]:
            if "properties" in part:
                named = True
                props.update(part["properties"])
            if "additionalProperties" in part:
                others = part["additionalProperties"]
        out = []
        for k, v in instance.items():
            if k in props:
                out += self._extra_fields(props[k], v, f"{where}/{k}")
            elif isinstance(others, dict):
                out += self._extra_fields(others, v, f"{where}/{k}")
            elif others is None and named:
                out.append(f"{where}/{k}")
        return out

    def not_exercised(self):
        return sorted(self.operations() - set(self.exercised))
