-- bench/create.lua: wrk script for bench/instances.py --reference. Each
-- request is POST /v1/instances for one MI450 card, signed in turn by the
-- API keys listed one per line in the file BENCH_KEYS_FILE names, so the
-- creates spread over users as bench/claims spreads its claims.
local keys = {}
for line in io.lines(os.getenv("BENCH_KEYS_FILE")) do
  keys[#keys + 1] = line
end
local body = '{"gpu_type": "MI450", "card_count": 1, "image": "rocm/pytorch:2.3-rocm6.2"}'
local n = 0

function setup(thread)
  thread:set("first", math.random(#keys))
end

function request()
  n = n + 1
  local key = keys[(n + (first or 0)) % #keys + 1]
  return wrk.format("POST", "/v1/instances",
                    { ["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json" }, body)
end
