-- wrk script: cycle through pre-generated requests, one per line of the file named
-- by the first script argument (wrk ... -s rotate.lua URL -- FILE):
--   METHOD<TAB>PATH<TAB>AUTHORIZATION<TAB>BODY     (BODY may be empty)
-- Every request is formatted once in init(), so request() is a table lookup.
-- done() prints one line, "BENCH_RESULT {json}", that bench/wrk.py reads.

local requests = {}
local count = 0
local index = 0
local threads = 0

function setup(thread)
   thread:set("thread_number", threads)
   threads = threads + 1
end

function init(args)
   local file = assert(io.open(args[1], "r"))
   local host = wrk.host .. ":" .. tostring(wrk.port)
   for line in file:lines() do
      local method, path, auth, body = line:match("^([^\t]+)\t([^\t]+)\t([^\t]*)\t(.*)$")
      if method then
         local headers = { ["Host"] = host }
         if auth ~= "" then
            headers["Authorization"] = auth
         end
         if body == "" then
            body = nil
         else
            headers["Content-Type"] = "application/json"
         end
         count = count + 1
         requests[count] = wrk.format(method, path, headers, body)
      end
   end
   file:close()
   assert(count > 0, "no requests in " .. args[1])
   -- Threads start at different places in the list, so they do not send the same key together.
   index = ((thread_number or 0) * 7919) % count
end

function request()
   index = index % count + 1
   return requests[index]
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, "status_errors": %d, '
         .. '"connect_errors": %d, "read_errors": %d, "write_errors": %d, "timeouts": %d, '
         .. '"p50_us": %d, "p99_us": %d, "mean_us": %.1f, "max_us": %d}\n',
      summary.requests, summary.duration, summary.bytes, e.status,
      e.connect, e.read, e.write, e.timeout,
      latency:percentile(50), latency:percentile(99), latency.mean, latency.max))
end
