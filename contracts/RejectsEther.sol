// SPDX-License-Identifier: MIT
// Test contract for the regtest suites: a contract destination that refuses ether (no receive and
// no payable fallback, so any payment reverts) but can hold tokens sent to it. Not for production.
pragma solidity ^0.8.20;

contract RejectsEther {
    function version() external pure returns (uint256) {
        return 1;
    }
}
