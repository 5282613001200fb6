-- After log_checked.lua: the partition's epoch and last sequence number.
-- Returns {epoch, seq}.
return {epoch, seq}
