-- 0006: kept free for the tenants' insert notification (merged from its own branch, which
-- replaces this file); here only so that the versions run without a gap.
SELECT 1;
